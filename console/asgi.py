"""ASGI entry point of the control plane: HTTP through Django, websockets through Channels."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from console.lib.bare_http import BareASGIHandler, split_by_path  # noqa: E402
from console.lib.body_limit import BodyLimit  # noqa: E402
from console.websocket import AllowedOriginsValidator  # noqa: E402
from console.ws_urls import websocket_urlpatterns as console_ws  # noqa: E402
from inference.ws_urls import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodyLimit(
            split_by_path(django_asgi_app, BareASGIHandler()),
            limit=settings.MAX_REQUEST_BODY_BYTES,
        ),
        "websocket": AllowedOriginsValidator(
            AuthMiddlewareStack(URLRouter([*console_ws, *websocket_urlpatterns]))
        ),
    }
)
