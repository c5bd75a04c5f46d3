"""Live events to every open console page, over the channel layer.

One group, ``phalanx.live``, joined by every ``/ws/live/`` socket (``console.consumers``). In the
embedded default the layer is in-memory (one process); with ``REDIS_URL`` it is channels-redis,
so a message sent in any process reaches browsers connected to any other. What a message says
is the features' business (``nodes.live`` for node rows and events); this only sends it.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

LIVE_GROUP = "phalanx.live"


def live_send(message: dict[str, Any]) -> None:
    """Send ``message`` (a dict with a channels ``type``) to every open page, now. Never
    raises: a broadcast must never undo or fail the change it reports (a failure is logged)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(LIVE_GROUP, message)
    except Exception:
        log.warning("live broadcast %s failed", message.get("type"), exc_info=True)
