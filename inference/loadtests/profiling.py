"""Flame graphs of the control plane and of one node agent during a run, with py-spy.

``Profiler.start`` runs ``py-spy record --nonblocking --format flamegraph`` against each
process (``--nonblocking``: it does not pause the process it samples, so the load test measures
the array as it is); ``Profiler.stop`` sends each recorder SIGINT, which makes py-spy write its
SVG, and returns ``{name: {"pid", "file"}}`` or ``{name: {"error"}}`` per process. py-spy needs
to be allowed to read the other process's memory (root, or ``ptrace_scope`` 0); when it is not,
the report says so instead of a graph. Only Python frames are sampled (no ``--native``): the
node's llama.cpp time shows as the Python call that entered it.

A recorder attaches only to a process this array started, proved, never to whatever listens on
a port (``attest_control_plane``, ``attest_node``): the control plane by the pid it put in its
identity proof (``identity.prove``) and the same pid listening on the target's port; a node by
the credential in its environment, which only this array can derive for that node id. Each
attested process is remembered with its start time, checked again just before py-spy attaches
(a pid reused by another process is not attached to).
"""

from __future__ import annotations

import hmac
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

RATE_HZ = 50
STOP_TIMEOUT_S = 20.0


def py_spy() -> str | None:
    """The py-spy executable: beside this interpreter (the project's venv), or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass(frozen=True)
class Attested:
    """A process this array started, proved: its pid and its start time (``psutil``)."""

    pid: int
    started: float

    def same(self) -> bool:
        """The pid still names the process that was attested (not a reused pid)."""
        try:
            return psutil.Process(self.pid).create_time() == self.started
        except psutil.Error:
            return False


def _attested(pid: int) -> Attested | str:
    try:
        return Attested(pid, psutil.Process(pid).create_time())
    except psutil.Error as exc:
        return f"process {pid}: {type(exc).__name__}"


def attest_control_plane(proven_pid: int | None, address: str) -> Attested | str:
    """The control plane to profile: the pid its identity proof named, when that pid is also
    the one listening on ``address`` (``host:port``); else why not (text)."""
    from nodes.utilization import listening_pid

    if proven_pid is None:
        return "the target did not prove it is this control plane"
    listening = listening_pid(address)
    if listening != proven_pid:
        return f"the process on {address} ({listening}) is not the one that proved it is ours"
    return _attested(proven_pid)


def attest_node(node_id: str, address: str) -> Attested | str:
    """The node agent to profile: the process listening on its loopback ``address`` whose
    environment holds the credential this array derives for ``node_id``; else why not."""
    from nodes.agent.auth import ENV_CREDENTIAL
    from nodes.credentials import node_credential
    from nodes.utilization import listening_pid

    pid = listening_pid(address)
    if pid is None:
        return "no local process found for it"
    try:
        given = psutil.Process(pid).environ().get(ENV_CREDENTIAL, "")
    except psutil.Error as exc:
        return f"cannot confirm process {pid} is node {node_id}: {type(exc).__name__}"
    if not given or not hmac.compare_digest(given, node_credential(node_id)):
        return f"process {pid} on {address} is not node {node_id} of this array"
    return _attested(pid)


@dataclass
class Profiler:
    """Recorders of one run, writing ``<name>.svg`` under ``directory``."""

    directory: Path
    recorders: dict[str, tuple[int, subprocess.Popen]] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def start(self, targets: dict[str, Attested | str]) -> None:
        """Start recording each ``{name: attested process}``; a process that was not attested
        (the text says why), one whose pid now names another process, or no py-spy is a
        result now."""
        exe = py_spy()
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, target in targets.items():
            if isinstance(target, str):
                self.results[name] = {"error": target}
            elif exe is None:
                self.results[name] = {"error": "py-spy is not installed"}
            elif not target.same():
                self.results[name] = {"error": f"process {target.pid} is gone"}
            else:
                self.recorders[name] = (target.pid, self._record(exe, name, target.pid))

    def _record(self, exe: str, name: str, pid: int) -> subprocess.Popen:
        out = self.directory / f"{name}.svg"
        return subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(RATE_HZ),
                "--nonblocking",
                "--format",
                "flamegraph",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop every recorder and collect what each wrote."""
        for name, (pid, proc) in self.recorders.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            out = self.directory / f"{name}.svg"
            if out.exists() and out.stat().st_size:
                self.results[name] = {"pid": pid, "file": out.name}
            else:
                why = (err or b"").decode(errors="replace").strip().splitlines()
                self.results[name] = {"pid": pid, "error": why[-1][:300] if why else "no output"}
        self.recorders.clear()
        return dict(self.results)
