"""Structured log records for every Phalanx process (structlog over the standard ``logging``).

Every record, ours and Django's, daphne's and httpx's alike (the standard ``logging`` bridge:
``structlog.stdlib.ProcessorFormatter``), carries ``time`` (UTC, ISO 8601), ``level``,
``logger``, ``process`` (what runs: ``serve``, ``controlloop``, ``runnode`` ... the
``manage.py`` command), ``node_id`` where the process is a node, ``event`` (the message) and
the fields bound to the work under way: a chat turn binds ``request_id``, ``session_id``,
``node_id`` and ``package`` (``bind``), so each line of that turn names them on both the
control plane and the node. ``$PHALANX_LOG_FORMAT``: ``text`` (default: one readable line,
``<time> <LEVEL> <logger>: <message> key=value ...``) or ``json`` (one JSON object a line).

Request ids are checked where they enter (``inference.request_checks.request_id``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import Any

import structlog

_process = {"process": "", "node_id": ""}


def bind(**fields: Any) -> None:
    """Bind ``fields`` (non-empty ones) to every record of the work under way (the current
    asyncio task or thread: ``contextvars``)."""
    structlog.contextvars.bind_contextvars(**{k: v for k, v in fields.items() if v})


def unbind() -> None:
    """Clear what ``bind`` bound (a thread or task that goes on to other work)."""
    structlog.contextvars.clear_contextvars()


def set_process(name: str, *, node_id: str = "") -> None:
    """Name this process in every record (``process``; ``node_id`` for a node agent)."""
    _process.update(process=name, node_id=node_id)


def _add_process(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    event.setdefault("process", _process["process"] or _command_name())
    if _process["node_id"]:
        event.setdefault("node_id", _process["node_id"])
    return event


def _command_name() -> str:
    """The ``manage.py`` command this process runs (``serve``, ``runnode`` ...), else the
    program's name."""
    args = sys.argv
    if len(args) > 1 and args[0].endswith("manage.py"):
        return args[1]
    return os.path.basename(args[0]) if args else "python"


# What a record must never carry (docs/control-plane.md): API tokens (phx_...), join tokens
# (phxj_...), node credentials (phx1./phx2. + 64 hex), anything after "Bearer", and any 64
# hex digits (the array's node secret and nodes' proof keys are such: a package's SHA-256 is
# redacted with them, the price of never printing a secret)
SECRET = re.compile(
    r"(?i:bearer)\s+\S+|phxj?_[A-Za-z0-9_-]{16,}|phx[12]\.[0-9a-f]{64}|(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])"
)
REDACTED = "[redacted]"


def redact(text: str) -> str:
    """``text`` with every secret ``SECRET`` matches replaced by ``[redacted]``."""
    return SECRET.sub(REDACTED, text)


def _redact(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """Every value as the record will show it, redacted: a string, and any other object but a
    number, bool or None as its text (Django logs the request object, whose text is the URL
    with its query string)."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = redact(value)
        elif not isinstance(value, int | float | bool | type(None)):
            event[key] = redact(json.dumps(value, default=str) if _plain(value) else str(value))
    return event


def _plain(value: Any) -> bool:
    return isinstance(value, dict | list | tuple)


def _one_line(text: str) -> str:
    """``text`` with line breaks escaped: whatever a message holds (a node's bytes, a
    client's header), it cannot start a record of its own."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _value(value: Any) -> str:
    """A field's value in ``key=value`` form: quoted (JSON) when it holds a space, ``=`` or a
    quote, so a value cannot pose as another field (logfmt's rule)."""
    text = value if isinstance(value, str) else str(value)
    if not text or any(c in text for c in ' ="\\') or not text.isprintable():
        return json.dumps(text)
    return text


def _text(_: Any, __: str, event: dict[str, Any]) -> str:
    """``<time> <LEVEL> <logger>: <message> key=value ...``: the message as written but on one
    line, values quoted where they need it; a traceback follows on its own lines."""
    head = f"{event.pop('timestamp', '')} {event.pop('level', '').upper()} "
    head += f"{event.pop('logger', '')}: {_one_line(str(event.pop('event', '')))}"
    exc = event.pop("exception", "")
    event.pop("process", None)  # the process is whoever writes to this stream
    tail = "".join(f" {k}={_value(v)}" for k, v in event.items() if not k.startswith("_"))
    return head + tail + (f"\n{exc}" if exc else "")


def _json(_: Any, __: str, event: dict[str, Any]) -> str:
    event["time"] = event.pop("timestamp", "")
    return json.dumps(event, default=str)


PRE_CHAIN: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.ExtraAdder(),  # logging's extra={...}: the record's fields
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    _add_process,
]


def formatter(kind: str | None = None) -> logging.Formatter:
    """A ``logging.Formatter`` for any record: ``kind`` ``json`` or ``text`` (default
    ``$PHALANX_LOG_FORMAT``, else ``text``)."""
    kind = kind or os.environ.get("PHALANX_LOG_FORMAT", "text")
    render = _json if kind == "json" else _text
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=PRE_CHAIN,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            _redact,  # after the traceback is text: it is redacted too
            render,
        ],
    )


def logging_config(level: str) -> dict[str, Any]:
    """Django's ``LOGGING``: every record through ``formatter`` to stderr at ``level``, and to
    the process's log shipping when it ships."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"phalanx": {"()": formatter}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "phalanx"},
            # this process's shipping, when it ships (console.lib.log_shipping): kept when
            # something configures logging again (django.setup() in console.asgi does)
            "shipping": {"()": "console.lib.log_shipping.shipping_handler"},
        },
        "root": {"handlers": ["console", "shipping"], "level": level},
        "loggers": {"httpx": {"level": "WARNING"}, "daphne": {"level": "WARNING"}},
    }
