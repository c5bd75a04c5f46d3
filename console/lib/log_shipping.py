"""Shipping every process's log records to the control plane's store (``console.lib.log_store``).

A ``ShippingHandler`` on the root logger turns each record into one JSON line (the ``json`` form
of ``console.lib.logs``, redacted) and hands it to a ``Shipper``: a bounded in-memory buffer
that never blocks the thread that logs (a full buffer drops its oldest line and counts it) and
one thread that sends the buffer every ``SHIP_INTERVAL_S`` (sooner when ``BATCH_LINES`` wait),
in batches of at most ``BATCH_BYTES``. Where it sends is a ``deliver`` function: the database
itself for the processes that have it (control planes, control loop, job workers:
``to_database``), ``POST /api/nodes/self/logs`` with the node's credential for a node agent
(``to_control_plane``). A node that cannot reach the control plane appends what it could not
send to its spool file, of which it keeps the last ``$PHALANX_LOG_SPOOL_MIB`` (default 16) MiB,
and sends the spool first, oldest first, when the control plane answers again.

Only a process's main command ships (``manage.py serve``, ``runnode`` ...: ``ship_from_here``),
and not when ``$PHALANX_SHIP_LOGS`` is ``0``; the test process never does.
"""

from __future__ import annotations

import atexit
import logging
import os
import ssl
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from console.lib import logs

SHIP_INTERVAL_S = 1.0
BATCH_LINES = 500  # this many waiting wake the shipper before its interval
BATCH_BYTES = 512 << 10
BATCH_MAX_LINES = 5000  # the control plane takes at most 10,000 records a request
BUFFER_BYTES = 8 << 20  # in memory, per process, between two sends
ENV_SHIP = "PHALANX_SHIP_LOGS"
ENV_SPOOL_MIB = "PHALANX_LOG_SPOOL_MIB"
ENV_LOGS_URL = "PHALANX_LOGS_URL"  # where a node agent ships (``up`` sets it; --join's URL else)

log = logging.getLogger(__name__)


class Undelivered(Exception):
    """The destination could not take a batch now (unreachable, 5xx, refused credential):
    try again later."""


class Refused(Exception):
    """The destination will never take this batch (it says the lines are not records): it is
    dropped and counted."""


Deliver = Callable[[Sequence[str]], None]


class Spool:
    """A file of lines not yet delivered (one JSON record a line), keeping the newest
    ``max_bytes``: past it the oldest lines are dropped (``add`` returns how many)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes

    def lines(self) -> list[str]:
        try:  # a line cut by a crash mid-write is kept, its broken bytes replaced
            return self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def add(self, lines: Sequence[str]) -> int:
        """Append ``lines``; returns the number of oldest lines dropped to stay in bound."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in lines)
        if self.path.stat().st_size <= self.max_bytes:
            return 0
        kept, size = deque(), 0
        for line in reversed(self.lines()):
            size += len(line.encode()) + 1
            if size > self.max_bytes:
                break
            kept.appendleft(line)
        dropped = len(self.lines()) - len(kept)
        self.replace(list(kept))
        return dropped

    def replace(self, lines: Sequence[str]) -> None:
        """Keep exactly ``lines`` (what is still unsent), atomically."""
        partial = self.path.with_suffix(".partial")
        partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        partial.replace(self.path)


def batches(
    lines: Sequence[str], max_bytes: int = BATCH_BYTES, max_lines: int = BATCH_MAX_LINES
) -> list[list[str]]:
    """``lines`` cut into consecutive batches of at most ``max_bytes`` and ``max_lines`` (a
    longer line goes alone)."""
    out: list[list[str]] = [[]]
    size = 0
    for line in lines:
        if out[-1] and (size + len(line) + 1 > max_bytes or len(out[-1]) >= max_lines):
            out.append([])
            size = 0
        out[-1].append(line)
        size += len(line) + 1
    return [batch for batch in out if batch]


class Shipper:
    """The buffer and its sending thread (see the module). ``shipped``, ``dropped`` (buffer
    or spool overflow, or refused by the destination) and ``spooled`` count lines."""

    def __init__(
        self,
        deliver: Deliver,
        *,
        spool: Spool | None = None,
        buffer_bytes: int = BUFFER_BYTES,
        interval_s: float = SHIP_INTERVAL_S,
    ) -> None:
        self.deliver, self.spool = deliver, spool
        self.buffer_bytes, self.interval_s = buffer_bytes, interval_s
        self._lines: deque[str] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.shipped = self.dropped = self.spooled = 0

    def offer(self, line: str) -> None:
        """Queue ``line``; never blocks on the destination. Over the bound the oldest go."""
        with self._lock:
            self._lines.append(line)
            self._bytes += len(line)
            self._bound()
            many = len(self._lines) >= BATCH_LINES
        if many:
            self._wake.set()

    def _bound(self) -> None:
        """Drop the oldest lines past ``buffer_bytes`` (the newest always stays)."""
        while self._bytes > self.buffer_bytes and len(self._lines) > 1:
            self._bytes -= len(self._lines.popleft())
            self.dropped += 1

    def _take(self) -> list[str]:
        with self._lock:
            lines = list(self._lines)
            self._lines.clear()
            self._bytes = 0
        return lines

    def _send(self, lines: Sequence[str]) -> list[str]:
        """Deliver ``lines`` batch by batch; returns those not delivered (from the first batch
        that failed on)."""
        for start, batch in self._batches_from(lines):
            try:
                self.deliver(batch)
            except Refused as exc:
                self.dropped += len(batch)
                log.warning("log records refused: %s", exc, extra={"lines": len(batch)})
                continue
            except Undelivered:
                return list(lines[start:])
            self.shipped += len(batch)
        return []

    @staticmethod
    def _batches_from(lines: Sequence[str]):
        start = 0
        for batch in batches(lines):
            yield start, batch
            start += len(batch)

    def flush(self) -> None:
        """Send the spool (if any, first) and then the buffer; what cannot go now is spooled
        (with a spool) or queued again ahead of newer lines (without)."""
        lines = self._take()
        try:
            if self.spool is not None:
                waiting = self.spool.lines()
                if waiting:
                    unsent = self._send(waiting)
                    self.spool.replace(unsent)
                    if unsent:
                        return  # the buffer waits (kept below) behind the spool
            lines = self._send(lines)
        finally:
            self._keep(lines)  # what was not sent, whatever failed on the way

    def _keep(self, unsent: list[str]) -> None:
        if not unsent:
            return
        if self.spool is not None:
            self.spooled += len(unsent)
            self.dropped += self.spool.add(unsent)
            return
        with self._lock:  # ahead of what was logged meanwhile, oldest first
            self._lines.extendleft(reversed(unsent))
            self._bytes += sum(len(line) for line in unsent)
            self._bound()

    def run(self) -> None:
        """The sending thread's loop: flush every ``interval_s`` (or when woken) until
        ``stop``, then once more."""
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self._flush_logged()
        self._flush_logged()

    def _flush_logged(self) -> None:
        try:
            self.flush()
        except Exception:  # the shipper must outlive any failure; the line is printed
            print("phalanx: log shipping failed", file=sys.stderr)

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="log-shipper", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread after one last send (within ``timeout`` s)."""
        self._stop.set()
        self._wake.set()
        if self.thread is not None:
            self.thread.join(timeout)


class ShippingHandler(logging.Handler):
    """Every record, as its JSON line, offered to ``shipper``; records the shipper's own
    thread writes (its HTTP client's, its database's) are not shipped again."""

    def __init__(self, shipper: Shipper) -> None:
        super().__init__()
        self.shipper = shipper
        self.setFormatter(logs.formatter("json"))

    def emit(self, record: logging.LogRecord) -> None:
        if threading.current_thread() is self.shipper.thread:
            return
        try:
            self.shipper.offer(self.format(record))
        except Exception:
            self.handleError(record)


# --- destinations ----------------------------------------------------------------------------


def to_database() -> Deliver:
    """Keep each batch in this process's database (``records_store``)."""

    def deliver(lines: Sequence[str]) -> None:
        from django.db import DatabaseError, close_old_connections

        from console.lib.log_store import records_store

        try:
            records_store(lines)
        except DatabaseError as exc:
            close_old_connections()
            raise Undelivered(str(exc)) from exc

    return deliver


def to_control_plane(
    base_url: str,
    *,
    node_id: str,
    credentials: Callable[[], Sequence[str]],
    verify: ssl.SSLContext | bool = True,
    timeout_s: float = 5.0,
) -> Deliver:
    """POST each batch to ``base_url``'s ``/api/nodes/self/logs?node_id=`` as JSON lines
    with the first of ``credentials()`` the control plane accepts (a node rotating its
    credential holds two)."""
    import httpx

    client = httpx.Client(timeout=timeout_s, trust_env=False, verify=verify)
    url = base_url.rstrip("/") + "/api/nodes/self/logs"

    def deliver(lines: Sequence[str]) -> None:
        body = "\n".join(lines).encode()
        for credential in credentials():
            try:
                response = client.post(
                    url,
                    params={"node_id": node_id},
                    content=body,
                    headers={
                        "Authorization": f"Bearer {credential}",
                        "Content-Type": "application/x-ndjson",
                    },
                )
            except httpx.HTTPError as exc:
                raise Undelivered(type(exc).__name__) from exc
            if response.status_code < 300:
                return
            if response.status_code in (400, 413, 422):
                raise Refused(response.text[:200])
            if response.status_code != 401:
                raise Undelivered(f"HTTP {response.status_code}")
        raise Undelivered("the control plane refuses this node's credential")

    return deliver


# --- this process ----------------------------------------------------------------------------

_running: list[ShippingHandler] = []


def shipping_handler() -> logging.Handler:
    """The handler ``LOGGING`` puts on the root logger (``console.lib.logs.logging_config``):
    this process's ``ShippingHandler`` once it ships, else one that does nothing."""
    return _running[-1] if _running else logging.NullHandler()


def shipping_wanted(command: str) -> bool:
    """Whether this process ships: it runs ``manage.py <command>`` as its main command and
    ``$PHALANX_SHIP_LOGS`` is not ``0`` (a test that calls a command in-process ships
    nothing)."""
    args = sys.argv
    ours = len(args) > 1 and args[0].endswith("manage.py") and args[1] == command
    return ours and os.environ.get(ENV_SHIP, "1") != "0"


def ship_from_here(command: str, deliver: Deliver, *, spool: Path | None = None) -> Shipper | None:
    """Ship every record of this process (see ``shipping_wanted``) to ``deliver`` from now
    on; ``spool``: the file that keeps what could not be sent. Returns the running
    ``Shipper`` (None when this process does not ship)."""
    if not shipping_wanted(command):
        return None
    spool_bytes = int(float(os.environ.get(ENV_SPOOL_MIB, "16")) * (1 << 20))
    shipper = Shipper(deliver, spool=Spool(spool, spool_bytes) if spool else None)
    shipper.start()
    handler = ShippingHandler(shipper)
    logging.getLogger().addHandler(handler)
    _running.append(handler)
    atexit.register(shipper.stop)
    return shipper
