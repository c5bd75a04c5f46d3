"""One way to write a moment and a size on every page: ``{{ value|when }}`` and
``{{ bytes|mib }}``.

A moment is drawn as ``<time datetime="ISO 8601">2026-12-01 22:33:05 UTC</time>``: the server
writes it in ``settings.TIME_ZONE`` (UTC by default) and ``static/console/live.js``
(``Phalanx.when``) redraws every ``<time datetime>`` in the operator's own time zone, the
browser's, in the same shape, zone shown (``2026-12-01 23:33:05 GMT+1``). docs/console.md,
"Times".
"""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

FORMAT = "%Y-%m-%d %H:%M:%S %Z"


def when_text(moment: datetime) -> str:
    """``moment`` as the pages write it on the server: ``YYYY-MM-DD HH:MM:SS ZONE`` in the
    current time zone (a naive ``moment`` is taken as UTC)."""
    return timezone.localtime(_aware(moment)).strftime(FORMAT)


def _aware(moment: datetime) -> datetime:
    return timezone.make_aware(moment, UTC) if timezone.is_naive(moment) else moment


@register.filter
def when(moment: datetime | str | None, empty: str = "—") -> SafeString | str:
    """A ``<time>`` element for ``moment`` (a datetime or an ISO 8601 string); ``empty`` (an
    em dash by default) when there is none."""
    if isinstance(moment, str):
        try:
            moment = datetime.fromisoformat(moment)
        except ValueError:
            return empty
    if not isinstance(moment, datetime):
        return empty
    iso = _aware(moment).isoformat(timespec="seconds")
    return format_html('<time datetime="{}">{}</time>', iso, when_text(moment))


MIB = 1024 * 1024


def mib_text(size_bytes: int | float) -> str:
    """``size_bytes`` in MiB (2^20 bytes) with one decimal: ``100.6 MiB``; the one unit the
    pages, the package jobs' messages (2^20 too) and the family chart's ``size_mib`` use."""
    return f"{size_bytes / MIB:.1f} MiB"


@register.filter
def mib(size_bytes: int | float | None, empty: str = "—") -> str:
    """``size_bytes`` as ``mib_text`` writes it; ``empty`` when there is none."""
    return mib_text(size_bytes) if size_bytes else empty
