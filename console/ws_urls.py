"""Websocket URL patterns of the console (mounted by ``console.asgi``)."""

from __future__ import annotations

from django.urls import re_path

from console.consumers import LiveConsumer, LoadTestConsumer, LogsConsumer

websocket_urlpatterns = [
    re_path(r"^ws/live/?$", LiveConsumer.as_asgi()),
    re_path(r"^ws/loadtests/(?P<run_id>[0-9]+)/?$", LoadTestConsumer.as_asgi()),
    re_path(r"^ws/logs/?$", LogsConsumer.as_asgi()),
]
