"""Switching what a node serves without restarting it: a new package, or new engine settings.

``PUT /package`` (docs/node-protocol.md) names the GGUF (a path on the node's host, with its
sha256) and optionally new settings. The node loads a second engine beside the one serving,
off the event loop, while the old one goes on answering; once the new one is ready it becomes
the node's engine in one step on the event loop (every request that starts afterwards uses
it; one already running keeps the engine it started on), and the old engine is stopped when
its last request has finished. A load that fails leaves the old engine serving and says why
(``GET /package``, ``/health``'s ``switch``).

The old engine's sessions (their KV) are not carried over: a different model cannot use them.
The control plane drains a node before switching it (inference/upgrades), so none are left.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inference.bundled import file_sha256
from inference.engine.config import EngineConfig
from inference.engine.scheduler import Engine
from nodes.agent.engine_settings import LIMITS, SETTINGS, bounds_sentence, context_refusal

LOAD_TIMEOUT_S = 600.0
RETIRE_TIMEOUT_S = 900.0  # the old engine's last streams; past it, it is stopped anyway


class SwitchRefused(ValueError):
    """The switch request is malformed (400) or names a file the node does not have."""


@dataclass(frozen=True)
class SwitchRequest:
    """What to serve next: the GGUF at ``model_path`` (sha256 hex, checked before loading;
    empty: not checked), the package name clients ask for, and settings that change."""

    model_path: str
    package: str
    sha256: str = ""
    settings: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Any) -> SwitchRequest:
        """Raises ``SwitchRefused`` naming the field that is wrong: a setting must be one of
        ``SETTINGS``, a whole number within its bounds (``engine_settings.LIMITS``, the same
        the control plane checks an upgrade's node settings against)."""
        if not isinstance(body, dict):
            raise SwitchRefused("the body must be a JSON object")
        path, package = body.get("model_path"), body.get("package")
        if not isinstance(path, str) or not path:
            raise SwitchRefused("model_path: the GGUF's path on this node's host")
        if not isinstance(package, str) or not package.strip():
            raise SwitchRefused("package: the name clients ask for")
        sha256 = body.get("sha256") or ""
        if not isinstance(sha256, str) or (sha256 and len(sha256) != 64):
            raise SwitchRefused("sha256: 64 hexadecimal digits")
        settings = body.get("settings") or {}
        if not isinstance(settings, dict):
            raise SwitchRefused("settings: an object")
        for key, value in settings.items():
            if key not in SETTINGS:
                raise SwitchRefused(f"settings.{key}: not a setting ({', '.join(SETTINGS)})")
            low, high = LIMITS[key]
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise SwitchRefused(f"settings.{key}: {bounds_sentence(key)}")
        if not os.path.isfile(path):
            raise SwitchRefused(f"model_path: no file at {path} on this node")
        return cls(path, package.strip(), sha256.lower(), dict(settings))

    def config(self, current: EngineConfig) -> EngineConfig:
        """The running engine's configuration with this request's file and settings. Raises
        ``SwitchRefused`` when its sequences and context per sequence are too many together
        (``engine_settings.MAX_CONTEXT_TOKENS``)."""
        config = dataclasses.replace(current, model_path=self.model_path, **self.settings)
        refusal = context_refusal(config.sequences, config.ctx_per_seq)
        if refusal is not None:
            raise SwitchRefused(f"settings.{refusal}")
        return config


@dataclass
class SwitchStatus:
    """The last switch: ``state`` is ``verifying``, ``loading``, ``done`` or ``failed``."""

    package: str
    sha256: str
    state: str = "verifying"
    error: str = ""
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    @property
    def running(self) -> bool:
        return self.state in ("verifying", "loading")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fail(self, error: str) -> None:
        self.state, self.error, self.finished_at = "failed", error, time.time()


def load_engine(
    request: SwitchRequest, current: EngineConfig, status: SwitchStatus
) -> Engine | None:
    """Check the file and load a new engine for ``request`` (on this thread; minutes for a
    big model). Returns the ready engine, or None with ``status`` failed and why."""
    if request.sha256:
        found = file_sha256(request.model_path)
        if found != request.sha256:
            status.fail(f"{request.model_path} has sha256 {found}, not {request.sha256}")
            return None
    status.state = "loading"
    engine = Engine(request.config(current))
    engine.start()
    if not engine.ready.wait(LOAD_TIMEOUT_S):
        engine.stop()
        status.fail(f"the model did not load within {LOAD_TIMEOUT_S:.0f} s")
        return None
    if engine.load_error:
        engine.stop()
        status.fail(f"the model did not load: {engine.load_error}")
        return None
    return engine


def retire(
    engine: Engine,
    *,
    holding: Callable[[], int] = lambda: 0,
    timeout: float = RETIRE_TIMEOUT_S,
    poll: float = 0.2,
) -> None:
    """Stop ``engine`` once nothing runs or waits on it and no request holds it (``holding``:
    requests that captured it, some still rendering their prompt); its last streams end
    first."""

    def wait_then_stop() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = engine.snapshot()
            if not snap["sequences_active"] and not snap["queue_depth"] and not holding():
                break
            time.sleep(poll)
        engine.stop()

    threading.Thread(target=wait_then_stop, name="engine-retire", daemon=True).start()
