"""A logged-in browser's session cookie for websocket tests (``WebsocketCommunicator`` headers)."""

from __future__ import annotations

from asgiref.sync import sync_to_async


@sync_to_async
def login_cookie(role, *, username: str | None = None) -> list[tuple[bytes, bytes]]:
    """The session cookie of a fresh logged-in user in ``role`` (a ``console.models.Role``;
    None: in no role group), as a ``[(b"cookie", ...)]`` header list."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from console.lib.access import user_set_role

    name = username or f"ws-{role.value if role else 'nobody'}"
    user = get_user_model().objects.create_user(username=name, password="pw")
    user_set_role(user=user, role=role)
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]
