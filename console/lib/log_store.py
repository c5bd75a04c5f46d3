"""The central log store: records every process ships (``console.lib.log_shipping``), kept in
the database (``console.models.LogRecord``) within an age and size bound, and queried by the
Logs page and ``GET /api/logs``.

A record arrives as one JSON object (``console.lib.logs``' ``json`` form: ``time``, ``level``,
``logger``, ``process``, ``node_id``, ``session_id``, ``request_id``, ``event`` and any other
field); ``records_store`` checks each where it enters, redacts it once more (a record from
another host is not trusted to have been) and keeps it. Retention (``records_trim``, every
minute in the control loop): ``$PHALANX_LOG_RETENTION_DAYS`` (default 7) and
``$PHALANX_LOG_RETENTION_MIB`` (default 256, the sum of the records' shipped bytes); the oldest
go first.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Q, Sum
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.lib.errors import Invalid
from console.lib.logs import redact
from console.models import LogRecord

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
# the record's own keys, kept in columns; every other key goes to ``fields``
COLUMNS = ("time", "level", "process", "node_id", "session_id", "request_id", "logger", "event")
WIDTHS = {"level": 10, "process": 40, "node_id": 64, "session_id": 128, "request_id": 128}
WIDTHS["logger"] = 128
MAX_EVENT_CHARS = 8192
MAX_FIELDS_BYTES = 16384
MAX_PAGE = 1000
MAX_LINES = 10000  # records one ingest request may carry (a shipper's batch holds far fewer)
# what a row costs the database beyond its shipped bytes (ids, columns, indexes): an estimate,
# so that the size bound holds for many small records too
ROW_BYTES = 200


class BadRecord(ValueError):
    """A shipped line that is not a log record: what is wrong with it, in words."""


@dataclass(frozen=True)
class Stored:
    """What ``records_store`` kept: ``stored`` records, ``rejected`` lines and the first
    rejected line's ``problem`` ("" when none was)."""

    stored: int
    rejected: int
    problem: str = ""


def _clean(text: str) -> str:
    """``text`` redacted, with what UTF-8 cannot hold (a lone surrogate) replaced."""
    return redact(text.encode("utf-8", "replace").decode("utf-8"))


def _text(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    text = "" if value is None else value if isinstance(value, str) else str(value)
    return _clean(text)[: WIDTHS.get(key, MAX_EVENT_CHARS)]


FUTURE_SLACK = timedelta(hours=1)  # a clock this far ahead is believed; past it, "now"


def _time(value: Any, record: dict[str, Any]) -> datetime:
    """The record's time: aware, UTC; one more than ``FUTURE_SLACK`` ahead (a node's clock
    gone wrong, which the age bound would then never remove) becomes now, the time it
    claimed kept in its fields as ``shipped_time``."""
    if value in (None, ""):
        return timezone.now()
    try:
        moment = parse_datetime(value) if isinstance(value, str) else None
        if moment is not None:
            aware = moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)
            moment = aware.astimezone(UTC)
    except (ValueError, OverflowError):
        moment = None
    if moment is None:
        raise BadRecord(f"time: {str(value)[:40]!r} is not an ISO 8601 time")
    if moment > timezone.now() + FUTURE_SLACK:
        record["shipped_time"] = str(value)[:40]
        return timezone.now()
    return moment


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON whatever it held: every string (and key) cleaned, a number
    that is not finite as its text, nothing deeper than 20 levels."""
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth >= 20:
        return "[too deep]"
    if isinstance(value, dict):
        return {_clean(str(k))[:64]: _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    return _clean(str(value))


def _fields(record: dict[str, Any]) -> dict[str, Any]:
    """The record's other keys, every string, key and nested value redacted; past
    ``MAX_FIELDS_BYTES`` one note says so."""
    rest = {k: v for k, v in record.items() if k not in COLUMNS and not k.startswith("_")}
    shown = _plain(rest)
    text = json.dumps(shown)
    if len(text) > MAX_FIELDS_BYTES:
        return {"truncated": redact(text[:MAX_FIELDS_BYTES])}
    return shown


def record_from(line: str | bytes, *, node_id: str = "") -> LogRecord:
    """The ``LogRecord`` one shipped ``line`` holds (not saved). ``node_id``: the node that
    shipped it, which the record cannot claim otherwise. Raises ``BadRecord``."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise BadRecord(f"not JSON ({str(exc)[:60]})") from None
    except RecursionError:
        raise BadRecord("not JSON this program reads (nested too deep)") from None
    if not isinstance(record, dict):
        raise BadRecord("not a JSON object")
    if not isinstance(record.get("event"), str):
        raise BadRecord("event: a record needs its message, a string")
    level = str(record.get("level", "info")).lower()
    if level not in LEVELS:
        raise BadRecord(f"level: {level[:20]!r} is not one of {', '.join(LEVELS)}")
    if node_id:
        record["node_id"] = node_id
    moment = _time(record.get("time"), record)
    return LogRecord(
        time=moment,
        level=level,
        levelno=LEVELS[level],
        **{key: _text(record, key) for key in ("process", "node_id", "session_id", "request_id")},
        logger=_text(record, "logger"),
        event=_text(record, "event"),
        fields=_fields(record),
        size=len(line) + ROW_BYTES,
    )


def records_store(lines: Iterable[str | bytes], *, node_id: str = "") -> Stored:
    """Keep every record ``lines`` hold (one JSON object each; blank lines skipped);
    ``node_id``: the shipping node, stamped on its records. A line that is not a record is
    counted in ``rejected`` and named in ``problem``, and the others are kept."""
    rows: list[LogRecord] = []
    rejected, problem = 0, ""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(record_from(line, node_id=node_id))
        except BadRecord as exc:
            rejected += 1
            problem = problem or f"line {number}: {exc}"
    LogRecord.objects.bulk_create(rows, batch_size=500)
    return Stored(stored=len(rows), rejected=rejected, problem=problem)


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogQuery:
    """Which records: each given filter must match (``level`` is a minimum); newest first,
    ``limit`` of them with ids below ``before`` (the previous page's last id), or, with
    ``after``, the ones newer than that id, oldest first (a live tail)."""

    request_id: str = ""
    session_id: str = ""
    node_id: str = ""
    process: str = ""
    level: str = ""
    since: datetime | None = None
    until: datetime | None = None
    before: int | None = None
    after: int | None = None
    limit: int = 100

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) for a query that cannot be asked, else None."""
        if self.level and self.level.lower() not in LEVELS:
            return "level", f"must be one of {', '.join(LEVELS)}"
        if not 1 <= self.limit <= MAX_PAGE:
            return "limit", f"must be 1 to {MAX_PAGE}"
        if self.since and self.until and self.since > self.until:
            return "since", "is after until"
        return None

    def filter(self) -> Q:
        q = Q()
        for key in ("request_id", "session_id", "node_id", "process"):
            if getattr(self, key):
                q &= Q(**{key: getattr(self, key)})
        if self.level:
            q &= Q(levelno__gte=LEVELS[self.level.lower()])
        if self.since:
            q &= Q(time__gte=self.since)
        if self.until:
            q &= Q(time__lte=self.until)
        return q


def records_find(query: LogQuery) -> list[LogRecord]:
    """The page of records ``query`` asks for (see ``LogQuery``)."""
    rows = LogRecord.objects.filter(query.filter())
    if query.after is not None:
        return list(rows.filter(id__gt=query.after).order_by("id")[: query.limit])
    if query.before is not None:
        rows = rows.filter(id__lt=query.before)
    return list(rows.order_by("-id")[: query.limit])


def records_all(query: LogQuery, chunk: int = 2000) -> Iterator[LogRecord]:
    """Every record ``query``'s filters match, newest first, read ``chunk`` at a time (the
    JSON-lines export); ``limit`` is ignored."""
    before = query.before
    while True:
        page = records_find(
            LogQuery(**{**query.__dict__, "before": before, "after": None, "limit": chunk})
        )
        yield from page
        if len(page) < chunk:
            return
        before = page[-1].id


def record_out(row: LogRecord) -> dict[str, Any]:
    """A record as the API and the export show it."""
    return {
        "id": row.id,
        "time": row.time.isoformat(),
        "level": row.level,
        "process": row.process,
        "node_id": row.node_id,
        "session_id": row.session_id,
        "request_id": row.request_id,
        "logger": row.logger,
        "event": row.event,
        "fields": row.fields,
    }


# --- retention -------------------------------------------------------------------------------


def retention_days() -> float:
    return float(os.environ.get("PHALANX_LOG_RETENTION_DAYS", "7"))


def retention_bytes() -> int:
    return int(float(os.environ.get("PHALANX_LOG_RETENTION_MIB", "256")) * (1 << 20))


def records_trim(
    *, max_age_s: float | None = None, max_bytes: int | None = None, chunk: int = 5000
) -> int:
    """Remove records older than ``max_age_s`` and then the oldest until the rest's shipped
    bytes fit ``max_bytes`` (defaults: ``retention_days``, ``retention_bytes``). Returns how
    many went."""
    max_age_s = retention_days() * 86400 if max_age_s is None else max_age_s
    max_bytes = retention_bytes() if max_bytes is None else max_bytes
    cutoff = timezone.now() - timedelta(seconds=max_age_s)
    removed, _ = LogRecord.objects.filter(time__lt=cutoff).delete()
    excess = (LogRecord.objects.aggregate(total=Sum("size"))["total"] or 0) - max_bytes
    while excess > 0:
        oldest = list(LogRecord.objects.order_by("id").values_list("id", "size")[:chunk])
        if not oldest:
            break
        last_id = oldest[-1][0]
        for row_id, size in oldest:
            excess -= size
            if excess <= 0:
                last_id = row_id
                break
        removed += LogRecord.objects.filter(id__lte=last_id).delete()[0]
    return removed


def records_trim_now() -> None:
    """The control loop's periodic retention (``records_trim`` with the configured bounds);
    what went is logged."""
    removed = records_trim()
    if removed:
        logging.getLogger(__name__).info(
            "log retention removed records", extra={"removed": removed}
        )


QUERY_KEYS = ("request_id", "session_id", "node_id", "process", "level", "since", "until")


def _moment(name: str, text: str) -> datetime | None:
    if not text:
        return None
    try:
        moment = parse_datetime(text.strip().replace(" ", "T", 1))
        if moment is not None:
            aware = moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)
            return aware.astimezone(UTC)
    except (ValueError, OverflowError):
        pass
    raise Invalid(f"{name}: {text[:40]!r} is not an ISO 8601 time", field=name)


def _number(name: str, text: str | None) -> int | None:
    if text in (None, ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise Invalid(f"{name}: must be a whole number", field=name) from None


def query_from(params: Mapping[str, str]) -> LogQuery:
    """The ``LogQuery`` that request parameters ask for (the API's, the page's, the live
    tail's: ``request_id``, ``session_id``, ``node_id``, ``process``, ``level`` (minimum),
    ``since``/``until`` (ISO 8601, UTC unless it says), ``before``/``after`` (record ids),
    ``limit``). Raises ``Invalid`` naming the parameter that is wrong."""
    query = LogQuery(
        **{k: params.get(k, "").strip() for k in QUERY_KEYS[:5]},
        since=_moment("since", params.get("since", "")),
        until=_moment("until", params.get("until", "")),
        before=_number("before", params.get("before")),
        after=_number("after", params.get("after")),
        limit=100 if not params.get("limit") else _number("limit", params["limit"]),
    )
    problem = query.problem()
    if problem:
        raise Invalid(f"{problem[0]}: {problem[1]}", field=problem[0])
    return query
