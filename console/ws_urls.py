"""Websocket URL patterns of the console (mounted by ``console.asgi``)."""

from __future__ import annotations

from django.urls import re_path

from console.consumers import LiveConsumer

websocket_urlpatterns = [re_path(r"^ws/live/?$", LiveConsumer.as_asgi())]
