"""Device validation on the node: the agent collects its inventory and runs its benchmarks
when the control plane asks (``POST /validation``), one run at a time, on a thread of its own,
and reports progress and the result (``GET /validation``). It also keeps a fingerprint of its
inventory fresh (``DeviceWatch``), so the control plane sees a module or firmware change in
``/health`` and validates the node again. See docs/validation.md.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inference.engine.scheduler import Engine
from inference.gguf_meta import read_gguf_info
from nodes.devices import bench
from nodes.devices.host import Host
from nodes.devices.inventory import collect, fingerprint

WATCH_INTERVAL_S = float(os.environ.get("PHALANX_INVENTORY_INTERVAL_S", "60"))
RUN_ID_MAX = 64

# (phase, share of the run's time it takes here, roughly: progress moves by it)
PHASES = (
    ("inventory", 0.15),
    ("memory bandwidth", 0.1),
    ("prompt processing", 0.15),
    ("decode, 1 sequence", 0.2),
    ("decode, 8 sequences", 0.4),
)


class ValidationBusy(RuntimeError):
    """A run is under way on this node already."""


@dataclass
class ValidationTask:
    """One run on the node: ``state`` "running", "done" or "failed"; ``report`` when done."""

    run_id: str
    state: str = "running"
    phase: str = "starting"
    progress: float = 0.0
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    error: str = ""
    report: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run_id,
            "state": self.state,
            "phase": self.phase,
            "progress": round(self.progress, 3),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "error": self.error,
            "report": self.report,
        }


def engine_facts(engine: Engine) -> dict[str, Any]:
    """What the matrix needs of the node's engine and model (see ``nodes.devices.matrix.Facts``)."""
    import psutil

    config = engine.config
    try:
        model_bytes = os.path.getsize(config.model_path)
        quantization = read_gguf_info(config.model_path).quantization
    except OSError:
        model_bytes, quantization = 0, ""
    return {
        "threads": config.threads,
        "sequences": config.sequences,
        "ctx_per_seq": config.ctx_per_seq,
        "kv_bytes_per_token": engine.kv_bytes_per_token,
        "model_bytes": model_bytes,
        "host_ram_bytes": config.host_ram_mib * 1024 * 1024,
        "held_bytes": _anonymous_rss(psutil.Process().memory_info()),
        "quantization": quantization,
    }


def _anonymous_rss(info) -> int:
    """Resident memory the node holds beyond file pages (the mmapped model is counted once,
    as ``model_bytes``; the kernel's available memory counts its cached pages too)."""
    return max(0, int(info.rss) - int(getattr(info, "shared", 0)))


class DeviceValidation:
    """The node's validation runs and its inventory watch. ``engine`` gives the engine that
    serves now (a package switch replaces it)."""

    def __init__(self, host: Host, engine: Callable[[], Engine]) -> None:
        self.host = host
        self.engine = engine
        self.instance = uuid.uuid4().hex  # this agent process: a restart is a new instance
        self.task: ValidationTask | None = None
        self._lock = threading.Lock()
        self._cpu_info: dict[str, Any] | None = None
        self.fingerprint = ""
        self.watched_at = 0.0

    # The inventory watch ------------------------------------------------------------------

    def inventory(self) -> dict[str, Any]:
        """A fresh inventory (py-cpuinfo's answer is read once per process); refreshes the
        fingerprint."""
        if self._cpu_info is None:
            self._cpu_info = self.host.cpu_info()
        inventory = collect(self.host, cpu_info=self._cpu_info)
        self.fingerprint, self.watched_at = fingerprint(inventory), time.time()
        return inventory

    def watch(self, stop: threading.Event, interval_s: float = WATCH_INTERVAL_S) -> None:
        """Refresh the fingerprint every ``interval_s`` until ``stop`` (a thread's target)."""
        while not stop.is_set():
            try:
                self.inventory()
            except Exception:  # a bad read must not end the watch; the next one may work
                pass
            stop.wait(interval_s)

    def health(self) -> dict[str, Any]:
        """The ``device`` block of ``/health``."""
        task = self.task
        return {
            "instance": self.instance,
            "fingerprint": self.fingerprint,
            "validation": {"run": task.run_id, "state": task.state} if task else None,
        }

    # Runs ---------------------------------------------------------------------------------

    def start(self, run_id: str) -> ValidationTask:
        """Start run ``run_id`` on a thread (the same id again: the run under way or done).
        Raises ``ValidationBusy`` while another run is under way, ``ValueError`` for a bad id."""
        if not run_id or len(run_id) > RUN_ID_MAX:
            raise ValueError(f"run must be a string of 1 to {RUN_ID_MAX} characters")
        with self._lock:
            if self.task is not None and self.task.run_id == run_id:
                return self.task
            if self.task is not None and self.task.state == "running":
                raise ValidationBusy(f"run {self.task.run_id} is under way")
            self.task = ValidationTask(run_id)
        threading.Thread(
            target=self._run, args=(self.task,), name="validation", daemon=True
        ).start()
        return self.task

    def _run(self, task: ValidationTask) -> None:
        started = time.perf_counter()
        try:
            task.report = self._measure(task)
            task.report["seconds"] = round(time.perf_counter() - started, 2)
            task.state = "done"
        except Exception as exc:  # the run fails, the node goes on; the report says why
            task.state, task.error = "failed", f"{task.phase}: {type(exc).__name__}: {exc}"[:1000]
        task.finished_at, task.progress = time.time(), 1.0

    def _measure(self, task: ValidationTask) -> dict[str, Any]:
        engine = self.engine()
        if not engine.ready.wait(timeout=300):
            raise bench.BenchmarkFailed("the model did not load in 300 s")
        task.phase = "waiting for requests under way to end"
        if not bench.wait_idle(engine):
            raise bench.BenchmarkFailed("requests kept the engine busy for 30 s")
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("inventory", self.inventory),
            ("memory bandwidth", bench.memory_bandwidth_gb_s),
            ("prompt processing", lambda: bench.prompt_tok_s(engine)),
            ("decode, 1 sequence", lambda: bench.decode_tok_s(engine, sequences=1)),
            (
                "decode, 8 sequences",
                lambda: bench.decode_tok_s(engine, sequences=bench.DECODE_SEQUENCES),
            ),
        ]
        values = []
        for (phase, share), (_, step) in zip(PHASES, steps, strict=True):
            task.phase = phase
            values.append(step())
            task.progress += share
        inventory, bandwidth, prompt, decode_1, decode_8 = values
        return {
            "instance": self.instance,
            "fingerprint": self.fingerprint,
            "inventory": inventory,
            "engine": engine_facts(engine),
            "bench": {
                "memory_bandwidth_gb_s": bandwidth,
                "prompt_tok_s": prompt,
                "prompt_tokens": min(bench.PROMPT_TOKENS, engine.config.ctx_per_seq - 8),
                "decode_tok_s_1": decode_1,
                "decode_tok_s_8": decode_8,
                "decode_tokens": bench.DECODE_TOKENS,
                "sequences_configured": engine.config.sequences,
            },
        }
