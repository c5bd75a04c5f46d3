"""Session transcripts: what the websocket ``/ws/sessions/<id>/`` keeps of each session, stored
on its routing-table row (``SessionRoute.transcript``, OpenAI messages).

Functions are synchronous (ORM); the consumer calls them through ``sync_to_async``.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from inference.models import SessionRoute


def transcript_get(*, session_id: str) -> list[dict[str, Any]]:
    """The stored transcript of a session (empty for a new one)."""
    route = SessionRoute.objects.filter(session_id=session_id).only("transcript").first()
    return list(route.transcript) if route else []


@transaction.atomic
def transcript_append(*, session_id: str, messages: list[dict[str, Any]]) -> int:
    """Append OpenAI messages to a session's transcript (creating the route if needed);
    returns the transcript's new length in messages."""
    route, _ = SessionRoute.objects.select_for_update().get_or_create(session_id=session_id)
    route.transcript = [*route.transcript, *messages]
    route.save(update_fields=["transcript", "last_seen_at"])
    return len(route.transcript)


def session_package_name(*, session_id: str) -> str | None:
    """The client-facing name of the session's model (the family its nodes are served as,
    which an upgrade keeps), or None for a new session."""
    from inference.model_names import family_of
    from inference.selectors import served_name

    route = SessionRoute.objects.filter(session_id=session_id).select_related("package").first()
    return family_of(served_name(route.package)) if route and route.package else None
