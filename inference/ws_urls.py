"""Websocket URL patterns of the inference app (mounted by ``console.asgi``)."""

from __future__ import annotations

from django.urls import re_path

from inference.consumers import SessionConsumer

websocket_urlpatterns = [
    # a session id may hold "/" (REST takes any printable key): everything up to the last "/"
    re_path(r"^ws/sessions/(?P<session_id>(?s:.+?))/?$", SessionConsumer.as_asgi()),
]
