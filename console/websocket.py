"""Origin check for the control plane's websockets.

Like channels' ``AllowedHostsOriginValidator`` (an ``Origin`` header must name an allowed host,
which stops cross-site websocket hijacking from a browser page), except that a handshake with
no ``Origin`` at all is let through: browsers always send one, so its absence means a
non-browser client (``websockets``, curl, the OpenAI tooling), which must still authenticate
with an API token in the consumer.
"""

from __future__ import annotations

from typing import Any

from channels.security.websocket import OriginValidator
from django.conf import settings


class OriginValidatorAllowingNonBrowsers(OriginValidator):
    def valid_origin(self, parsed_origin: Any) -> bool:
        if parsed_origin is None:
            return True
        return super().valid_origin(parsed_origin)


def AllowedHostsOriginValidator(application: Any) -> OriginValidatorAllowingNonBrowsers:  # noqa: N802
    """Wrap ``application`` so a browser's ``Origin`` must be one of ``settings.ALLOWED_HOSTS``."""
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    return OriginValidatorAllowingNonBrowsers(application, allowed_hosts)
