"""Origin check for the control plane's websockets.

Like channels' ``AllowedHostsOriginValidator`` (an ``Origin`` header must name an allowed host,
which stops cross-site websocket hijacking from a browser page), except that a handshake with
no ``Origin`` at all is let through: browsers always send one, so its absence means a
non-browser client (``websockets``, curl, the OpenAI tooling), which must still authenticate
with an API token in the consumer.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.security.websocket import OriginValidator
from django.conf import settings

log = logging.getLogger(__name__)


class OriginValidatorAllowingNonBrowsers(OriginValidator):
    """Channels' validator, letting a handshake without ``Origin`` through and logging every
    refusal with its reason (an operator's first question when a page's live view is dead)."""

    def valid_origin(self, parsed_origin: Any) -> bool:
        if parsed_origin is None:
            return True
        if super().valid_origin(parsed_origin):
            return True
        log.warning(
            "websocket refused: Origin %s is not in WEBSOCKET_ALLOWED_ORIGINS %s "
            "(set $PHALANX_WS_ALLOWED_ORIGINS)",
            parsed_origin.geturl(),
            ",".join(self.allowed_origins),
        )
        return False


def AllowedOriginsValidator(application: Any) -> OriginValidatorAllowingNonBrowsers:  # noqa: N802
    """Wrap ``application`` so a browser's ``Origin`` must match
    ``settings.WEBSOCKET_ALLOWED_ORIGINS`` (by default ``ALLOWED_HOSTS``)."""
    return OriginValidatorAllowingNonBrowsers(application, settings.WEBSOCKET_ALLOWED_ORIGINS)
