"""Flame graphs of the control plane and of one node agent during a run, with py-spy.

``Profiler.start`` runs ``py-spy record --nonblocking --format flamegraph`` against each
process (``--nonblocking``: it does not pause the process it samples, so the load test measures
the array as it is); ``Profiler.stop`` sends each recorder SIGINT, which makes py-spy write its
SVG, and returns ``{name: {"pid", "file"}}`` or ``{name: {"error"}}`` per process. py-spy needs
to be allowed to read the other process's memory (root, or ``ptrace_scope`` 0); when it is not,
the report says so instead of a graph. Only Python frames are sampled (no ``--native``): the
node's llama.cpp time shows as the Python call that entered it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RATE_HZ = 50
STOP_TIMEOUT_S = 20.0


def py_spy() -> str | None:
    """The py-spy executable: beside this interpreter (the project's venv), or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass
class Profiler:
    """Recorders of one run, writing ``<name>.svg`` under ``directory``."""

    directory: Path
    recorders: dict[str, tuple[int, subprocess.Popen]] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def start(self, pids: dict[str, int | None]) -> None:
        """Start recording each ``{name: pid}``; a missing pid or py-spy is a result now."""
        exe = py_spy()
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, pid in pids.items():
            if pid is None:
                self.results[name] = {"error": "no local process found for it"}
            elif exe is None:
                self.results[name] = {"error": "py-spy is not installed"}
            else:
                self.recorders[name] = (pid, self._record(exe, name, pid))

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
