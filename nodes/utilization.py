"""Utilization sampler: one snapshot of the whole array every second, pushed to live pages.

Each tick reads every node's ``/metrics`` (through ``nodes.client``'s shared HTTP client), the
inventory (state, package, pinned sessions, new events) and, with psutil, the host's CPU and
memory plus, for nodes on this host's loopback, their process's CPU % and resident memory. The
snapshot goes to the ``phalanx.live`` group as ``util.snapshot`` and into a ring of the last
``HISTORY_S`` seconds in the Django cache, which a new tab reads first.

Only one process samples at a time: the holder of a short lease in the cache (local memory in
the embedded mode, Redis with ``REDIS_URL``, shared by every replica). Every process with open
pages runs a sampler task that takes the lease over when its holder stops renewing it. A
sampler with no open page in its process for ``IDLE_STOP_S`` stops.

Snapshot shape (units: percent, bytes, tokens, tokens/s, seconds since the epoch)::

    {"seq": 17, "t": 1700000000.0, "host": {"cpu": 12.5, "mem": 41.0, "mem_used": 3.2e9},
     "nodes": {"node-01": {"state": "up", "colour": "green", "package": "name:1",
               "sessions": 3, "validation": "Passed", "ok": true, "error": "", "cpu": 48.0,
               "rss": 2.1e8,
               "prefill_tps": 310.0, "decode_tps": 41.0, "active": 1, "idle": 2, "host": 0,
               "total": 8, "kv_used": 512, "kv_capacity": 16384, "kv_pct": 3.1, "queue": 0,
               "requests": 12, "generated": 800}},
     "events": [<nodes.live.event_payload>, ...]}
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from datetime import timedelta
from typing import Any

import psutil
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.core.cache import cache
from django.db import close_old_connections
from django.utils import timezone

from console.lib.live import LIVE_GROUP
from console.models import UtilizationSample
from nodes import client as node_client
from nodes.live import event_payload
from nodes.metrics import parse_prometheus
from nodes.models import Node, NodeEvent
from nodes.selectors import nodes_status, nodes_with_pinned

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
HISTORY_S = 300
SLOTS = int(HISTORY_S / INTERVAL_S)
LEASE_S = 3.0
IDLE_STOP_S = 300.0
METRICS_TIMEOUT_S = 0.8
_KEY = "phalanx:util"
_OWNER = f"{os.getpid()}:{id(object())}"

# metric name (node label dropped) -> snapshot field
_FIELDS = {
    "phalanx_node_prefill_tokens_per_second": "prefill_tps",
    "phalanx_node_decode_tokens_per_second": "decode_tps",
    'phalanx_node_sequences{state="active"}': "active",
    'phalanx_node_sequences{state="idle"}': "idle",
    'phalanx_node_sequences{state="host"}': "host",
    "phalanx_node_sequences_total": "total",
    "phalanx_node_kv_used_tokens": "kv_used",
    "phalanx_node_kv_capacity_tokens": "kv_capacity",
    "phalanx_node_queue_depth": "queue",
    "phalanx_node_requests_total": "requests",
    "phalanx_node_generated_tokens_total": "generated",
    "phalanx_node_host_ram_bytes": "host_ram",
    # read by the alert rules' rates (inference.alerts.snapshot)
    "phalanx_node_failed_requests_total": "failed",
    "phalanx_node_restores_skipped_total": "restores_skipped",
    "phalanx_node_restored_from_host_total": "restored",
}


def metrics_fields(text: str) -> dict[str, float]:
    """Snapshot fields from a node's Prometheus text (``node="..."`` labels ignored), plus
    ``kv_pct`` (KV cells in use, percent of capacity) when both are known."""
    out: dict[str, float] = {}
    for key, value in parse_prometheus(text).items():
        name, _, labels = key.partition("{")
        kept = [p for p in labels.rstrip("}").split(",") if p and not p.startswith("node=")]
        canonical = name + ("{" + ",".join(kept) + "}" if kept else "")
        if canonical in _FIELDS:
            out[_FIELDS[canonical]] = value
    if out.get("kv_capacity"):
        out["kv_pct"] = round(100.0 * out.get("kv_used", 0.0) / out["kv_capacity"], 2)
    return out


# --- local node processes (psutil) -----------------------------------------------------------

_pids: dict[str, int] = {}
_pid_misses: dict[str, float] = {}
_procs: dict[int, psutil.Process] = {}


def _is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "[::1]", "::1")


def listening_pid(address: str) -> int | None:
    """The pid of the process listening on a loopback ``address`` (``host:port``), or None
    (a remote address, nobody listening, or not allowed to see it)."""
    host, _, port = address.rpartition(":")
    if not _is_loopback(host) or not port.isdigit():
        return None
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == int(port):
                return conn.pid
    except (psutil.Error, OSError):
        return None
    return None


def process_usage(address: str) -> tuple[float | None, float | None]:
    """``(cpu_percent, rss_bytes)`` of the process listening on a loopback ``address``, or
    ``(None, None)`` for a remote node or one not found. CPU % is since the previous call (100
    = one full CPU); the first call for a process gives 0."""
    pid = _pids.get(address)
    if pid is None:
        if time.monotonic() - _pid_misses.get(address, -1e9) < 10.0:
            return None, None
        pid = listening_pid(address)
        if pid is None:
            _pid_misses[address] = time.monotonic()
            return None, None
        _pids[address] = pid
    try:
        proc = _procs.get(pid) or _procs.setdefault(pid, psutil.Process(pid))
        with proc.oneshot():
            return proc.cpu_percent(None), float(proc.memory_info().rss)
    except psutil.Error:
        _pids.pop(address, None)
        _procs.pop(pid, None)
        return None, None


def host_usage() -> dict[str, float]:
    """This host's CPU % (all CPUs, since the previous call) and memory use."""
    memory = psutil.virtual_memory()
    return {"cpu": psutil.cpu_percent(None), "mem": memory.percent, "mem_used": float(memory.used)}


# --- one tick -----------------------------------------------------------------------------


def _inventory(after_event: int | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    close_old_connections()
    rows = list(nodes_with_pinned())
    statuses = nodes_status(rows)
    nodes = [
        {
            "node_id": n.node_id,
            "address": n.address,
            "state": n.state,
            "colour": Node.STATE_COLOURS.get(n.state, "grey"),
            "package": n.package.key if n.package else None,
            "sessions": n.pinned,
            "error": statuses[n.node_id].error,
            "error_at": statuses[n.node_id].error_at_iso,
            "badge": statuses[n.node_id].badge,
            "serving": statuses[n.node_id].serving,
            "recent_error": statuses[n.node_id].recent_error,
            "validation": n.get_validation_display(),
        }
        for n in rows
    ]
    last = NodeEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    events: list[dict[str, Any]] = []
    if after_event is not None and last > after_event:
        rows = NodeEvent.objects.select_related("node").filter(id__gt=after_event).order_by("id")
        events = [event_payload(e) for e in rows[:50]]
    return nodes, events, last


async def _metrics(node_id: str, address: str) -> dict[str, float] | None:
    text = await node_client.metrics_text(address, node_id=node_id, timeout=METRICS_TIMEOUT_S)
    return metrics_fields(text) if text is not None else None


def _usages(addresses: list[str]) -> tuple[dict[str, float], list[tuple[float | None, ...]]]:
    return host_usage(), [process_usage(a) for a in addresses]


async def take_snapshot(seq: int, after_event: int | None) -> tuple[dict[str, Any], int]:
    """Sample the array once; returns the snapshot and the newest event id seen."""
    nodes, events, last = await sync_to_async(_inventory, thread_sensitive=False)(after_event)
    metrics = await asyncio.gather(*(_metrics(n["node_id"], n["address"]) for n in nodes))
    host, usages = await asyncio.to_thread(_usages, [n["address"] for n in nodes])
    out: dict[str, Any] = {}
    for node, sample, (cpu, rss) in zip(nodes, metrics, usages, strict=True):
        node.pop("address")
        out[node["node_id"]] = {
            **node,
            "ok": sample is not None,
            "cpu": cpu,
            "rss": rss,
            **(sample or {}),
        }
    return {"seq": seq, "t": time.time(), "host": host, "nodes": out, "events": events}, last


# --- history: the control loop's samples, then the cache ring ------------------------------

KEEP_S = float(os.environ.get("PHALANX_UTILIZATION_KEEP_S", 24 * 3600))
DURABLE_HISTORY_S = 1800  # what a new tab gets from the database (the charts' window)


_loop: asyncio.AbstractEventLoop | None = None


def _sampling_loop() -> asyncio.AbstractEventLoop:
    """One event loop for this (blocking) process's samples, kept: its HTTP client and its
    executor's database connections are reused tick after tick (a loop per tick, as
    ``async_to_sync`` makes, leaked a socket and a connection each time)."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop


def record_sample() -> None:
    """Take one snapshot and keep it (the control loop calls this every tick); drop samples
    older than ``KEEP_S``."""
    snapshot, _ = _sampling_loop().run_until_complete(take_snapshot(0, None))
    snapshot.pop("events", None)
    now = timezone.now()
    UtilizationSample.objects.create(taken_at=now, snapshot=snapshot)
    UtilizationSample.objects.filter(taken_at__lt=now - timedelta(seconds=KEEP_S)).delete()


def _durable(since_s: float) -> list[dict[str, Any]]:
    close_old_connections()
    cutoff = timezone.now() - timedelta(seconds=since_s)
    return list(
        UtilizationSample.objects.filter(taken_at__gte=cutoff).values_list("snapshot", flat=True)
    )


async def history(since_s: float = DURABLE_HISTORY_S) -> list[dict[str, Any]]:
    """The kept snapshots, oldest first: the control loop's of the last ``since_s`` seconds,
    then this array's cache ring (the last ``HISTORY_S`` seconds at one a second)."""
    durable = await sync_to_async(_durable, thread_sensitive=False)(since_s)
    ring = await _ring()
    first_live = ring[0]["t"] if ring else float("inf")
    return [s for s in durable if s["t"] < first_live] + ring


async def _ring() -> list[dict[str, Any]]:
    seq = await cache.aget(f"{_KEY}:seq")
    if seq is None:
        return []
    keys = [f"{_KEY}:{i % SLOTS}" for i in range(max(0, seq - SLOTS + 1), seq + 1)]
    found = await cache.aget_many(keys)
    snaps = [found[k] for k in keys if k in found]
    return [s for s in snaps if s.get("seq", -1) > seq - SLOTS]


async def _store(snapshot: dict[str, Any]) -> None:
    seq = snapshot["seq"]
    await cache.aset(f"{_KEY}:{seq % SLOTS}", snapshot, timeout=HISTORY_S * 2)
    await cache.aset(f"{_KEY}:seq", seq, timeout=HISTORY_S * 2)


async def _hold_lease() -> bool:
    if await cache.aadd(f"{_KEY}:lease", _OWNER, timeout=LEASE_S):
        return True
    if await cache.aget(f"{_KEY}:lease") == _OWNER:
        await cache.aset(f"{_KEY}:lease", _OWNER, timeout=LEASE_S)
        return True
    return False


# --- the sampler task ----------------------------------------------------------------------


class UtilizationSampler:
    """The per-process sampling task; ``watchers`` counts this process's open live pages."""

    def __init__(self) -> None:
        self.watchers = 0
        self.idle_since = time.monotonic()
        self.task: asyncio.Task[None] | None = None

    async def tick(self, after_event: int | None) -> int | None:
        """One round: sample and publish if this process holds the lease; returns the newest
        event id seen (None when it did not sample)."""
        if not await _hold_lease():
            return None
        seq = (await cache.aget(f"{_KEY}:seq") or 0) + 1
        snapshot, last = await take_snapshot(seq, after_event)
        await _store(snapshot)
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(LIVE_GROUP, {"type": "util.snapshot", "snapshot": snapshot})
        return last

    async def run(self) -> None:
        """Tick every ``INTERVAL_S`` until no page watched for ``IDLE_STOP_S``, or until the
        task is cancelled: also when a library awaited in a tick swallowed the CancelledError
        (``Task.cancelling``), which otherwise kept a closing event loop waiting up to
        ``IDLE_STOP_S`` (seen as a test's teardown timing out)."""
        after: int | None = None
        task = asyncio.current_task()
        while not (task and task.cancelling()) and (
            self.watchers > 0 or time.monotonic() - self.idle_since < IDLE_STOP_S
        ):
            started = time.monotonic()
            try:
                seen = await self.tick(after)
                after = seen if seen is not None else None
            except Exception:  # keep sampling through a bad tick (database locked, ...)
                log.exception("utilization tick failed")
            await asyncio.sleep(max(0.05, INTERVAL_S - (time.monotonic() - started)))

    def watch(self) -> None:
        """A page opened: count it and make sure the task runs on this event loop."""
        self.watchers += 1
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.run())

    def unwatch(self) -> None:
        self.watchers = max(0, self.watchers - 1)
        if self.watchers == 0:
            self.idle_since = time.monotonic()


_samplers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, UtilizationSampler] = (
    weakref.WeakKeyDictionary()
)


def sampler() -> UtilizationSampler:
    """The sampler of the running event loop."""
    loop = asyncio.get_running_loop()
    found = _samplers.get(loop)
    if found is None:
        found = _samplers[loop] = UtilizationSampler()
    return found
