"""The one seam between device inventory and the machine: files under ``/proc`` and ``/sys``,
commands (``lspci``, ``nvidia-smi``, ``modinfo``, ``dmesg``), and the libraries that read the CPU
and memory (py-cpuinfo, psutil) and llama.cpp's build.

``LocalHost`` reads this machine. ``RecordedHost`` reads a fixture machine: a directory holding
``root/`` (a tree shaped like ``/``) and ``recorded/`` (command outputs and library answers);
tests describe machines we do not have with it (``tests/nodes/devices/machines/``).

Nothing here raises for a missing, unreadable or odd source: a read gives ``None`` and a command
a ``CommandResult`` that says why it has no output, so the inventory can say "unknown".
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

COMMAND_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CommandResult:
    """What one command gave: ``status`` is "ok", "not_found" (not installed), "not_permitted"
    (refused for lack of privilege) or "error" (failed otherwise); ``output`` is its stdout
    ("" unless ok); ``detail`` says what went wrong in a person's words."""

    status: str
    output: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Host(Protocol):
    """What inventory needs of a machine (see the module docstring)."""

    def read(self, path: str) -> str | None:
        """Text of the file at absolute ``path`` (e.g. ``/proc/meminfo``), None when absent or
        unreadable."""

    def listdir(self, path: str) -> list[str]:
        """Names in the directory at ``path``, sorted; [] when absent."""

    def run(self, argv: list[str]) -> CommandResult:
        """Run a command (bounded by ``COMMAND_TIMEOUT_S``)."""

    def cpu_info(self) -> dict[str, Any]:
        """py-cpuinfo's ``get_cpu_info()`` ({} when it fails)."""

    def memory(self) -> dict[str, int]:
        """``{"total": bytes, "available": bytes}`` as psutil reads them ({} when unknown)."""

    def affinity(self) -> list[int] | None:
        """CPUs this process may run on (``sched_getaffinity``), None when unknown."""

    def llama_system_info(self) -> str | None:
        """llama.cpp's ``llama_print_system_info()`` text, None when unknown."""

    def kernel_release(self) -> str | None:
        """``uname -r``."""


_PERMISSION_WORDS = ("operation not permitted", "permission denied", "not permitted")


def _classify(returncode: int, stderr: str) -> CommandResult:
    text = stderr.strip().splitlines()[0] if stderr.strip() else f"exit status {returncode}"
    if any(word in stderr.lower() for word in _PERMISSION_WORDS):
        return CommandResult("not_permitted", detail=text[:300])
    return CommandResult("error", detail=text[:300])


class LocalHost:
    """This machine."""

    def read(self, path: str) -> str | None:
        try:
            return Path(path).read_text(errors="replace")
        except (OSError, ValueError):
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def run(self, argv: list[str]) -> CommandResult:
        if shutil.which(argv[0]) is None:
            return CommandResult("not_found", detail=f"{argv[0]} is not installed")
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return CommandResult(
                "error", detail=f"{argv[0]} gave no answer in {COMMAND_TIMEOUT_S:g} s"
            )
        except OSError as exc:
            return CommandResult("error", detail=f"{argv[0]}: {exc}")
        if done.returncode != 0:
            return _classify(done.returncode, done.stderr)
        return CommandResult("ok", output=done.stdout)

    def cpu_info(self) -> dict[str, Any]:
        try:
            import cpuinfo

            return dict(cpuinfo.get_cpu_info())
        except Exception:  # py-cpuinfo runs probes of its own; any failure is "unknown"
            return {}

    def memory(self) -> dict[str, int]:
        import psutil

        memory = psutil.virtual_memory()
        return {"total": int(memory.total), "available": int(memory.available)}

    def affinity(self) -> list[int] | None:
        try:
            return sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return None

    def llama_system_info(self) -> str | None:
        try:
            from inference.engine.llama import system_info
        except Exception:  # noqa: BLE001 - llama-cpp-python missing or its library unloadable
            return None
        return system_info()

    def kernel_release(self) -> str | None:
        return os.uname().release


class RecordedHost:
    """A fixture machine: ``<directory>/root`` stands for ``/``; ``<directory>/recorded`` holds
    ``commands.json`` (``{"lspci -nn": {"status": "ok", "output": "..."}}``; a command it does
    not list is "not_found"), and ``cpuinfo.json``, ``memory.json``, ``affinity.json``,
    ``llama_system_info.txt``, ``kernel_release.txt`` (each missing = unknown)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.root = self.directory / "root"
        self.recorded = self.directory / "recorded"

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str) -> str | None:
        try:
            return self._path(path).read_text(errors="replace")
        except (OSError, ValueError):
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(path)))
        except OSError:
            return []

    def _recorded(self, name: str) -> Any:
        try:
            text = (self.recorded / name).read_text(errors="replace")
        except OSError:
            return None
        try:
            return json.loads(text) if name.endswith(".json") else text.strip()
        except ValueError:
            return None

    def run(self, argv: list[str]) -> CommandResult:
        commands = self._recorded("commands.json") or {}
        entry = commands.get(shlex.join(argv)) if isinstance(commands, dict) else None
        if not isinstance(entry, dict):
            return CommandResult("not_found", detail=f"{argv[0]} is not installed")
        return CommandResult(
            str(entry.get("status", "ok")),
            str(entry.get("output", "")),
            str(entry.get("detail", "")),
        )

    def cpu_info(self) -> dict[str, Any]:
        data = self._recorded("cpuinfo.json")
        return data if isinstance(data, dict) else {}

    def memory(self) -> dict[str, int]:
        data = self._recorded("memory.json")
        return data if isinstance(data, dict) else {}

    def affinity(self) -> list[int] | None:
        data = self._recorded("affinity.json")
        return data if isinstance(data, list) else None

    def llama_system_info(self) -> str | None:
        return self._recorded("llama_system_info.txt")

    def kernel_release(self) -> str | None:
        return self._recorded("kernel_release.txt")


def host_from_environment() -> Host:
    """``RecordedHost`` of ``PHALANX_DEVICE_FIXTURE`` when set (tests and demos of machines we
    do not have), else ``LocalHost``."""
    fixture = os.environ.get("PHALANX_DEVICE_FIXTURE", "")
    return RecordedHost(fixture) if fixture else LocalHost()
