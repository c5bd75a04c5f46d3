"""A node's inventory: what its machine is, read through a ``Host`` (``nodes.devices.host``).

``collect(host)`` returns plain JSON data (shape below); every section that could not be read
says so (``None``, ``[]`` or a ``status`` other than "ok") instead of raising. Each section is
read by a module of its own (``cpu``, ``memory``, ``llama_build``, ``accelerators``, ``kernel``).
``identity()`` is the part whose change means the node must prove itself again (firmware,
modules, kernel, CPU, budget, accelerators, llama.cpp's build); ``diff()`` lists what changed
between two identities. ``nodes.devices.summary`` writes an inventory for a person.

Shape of ``collect()``::

    {"cpu": {"model", "arch", "flags": [str], "logical", "physical", "microcode"},
     "cpu_budget": {"affinity": [int] | None, "cgroup_cpus": float | None,
                    "cgroup_source": str | None, "cpus": float | None},
     "numa": [{"node": int, "cpus": [int], "memory_bytes": int | None}],
     "memory": {"total", "available", "cgroup_limit", "cgroup_usage"} (bytes), "hugepages": {"total", "free", "size_kib"},
     "llama": {"text": str | None, "features": {"AVX2": "1", ...}, "backends": [str]},
     "accelerators": {"lspci": {"status", "detail"}, "pci": [{"slot", "class", "class_code",
                      "vendor_id", "device_id", "name"}], "drm": [{"card", "vendor_id",
                      "device_id", "driver"}], "nvidia_smi": {"status", "detail", "gpus": [...]}},
     "modules": {"status": "ok" | "unknown", "loaded": {name: version}},
     "firmware": {"bios_vendor", "bios_version", "bios_date", "board_vendor", "board_name",
                  "product_name"}, "kernel": {"release": str | None},
     "kernel_errors": {"status", "detail", "count", "lines": [str]}}
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from nodes.devices.accelerators import accelerators_section
from nodes.devices.cpu import cpu_budget_section, cpu_section, numa_section
from nodes.devices.host import Host
from nodes.devices.kernel import (
    ACCELERATOR_MODULES,
    firmware_section,
    kernel_errors_section,
    modules_section,
)
from nodes.devices.llama_build import llama_section
from nodes.devices.memory import hugepages_section, memory_section


def collect(host: Host, *, cpu_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole inventory (shape in the module docstring). ``cpu_info``: py-cpuinfo's answer
    read earlier (it takes about a second; the CPU does not change under a running agent)."""
    info = cpu_info if cpu_info is not None else host.cpu_info()
    return {
        "cpu": cpu_section(host, info),
        "cpu_budget": cpu_budget_section(host),
        "numa": numa_section(host),
        "memory": memory_section(host),
        "hugepages": hugepages_section(host),
        "llama": llama_section(host),
        "accelerators": accelerators_section(host),
        "modules": modules_section(host),
        "firmware": firmware_section(host),
        "kernel": {"release": host.kernel_release()},
        "kernel_errors": kernel_errors_section(host),
    }


# Identity and change -----------------------------------------------------------------------


def identity(inventory: dict[str, Any]) -> dict[str, Any]:
    """What must not change under a validated node without a new validation: CPU, budget,
    NUMA layout, total memory, hugepages, llama.cpp's build, accelerators and their driver,
    driver modules with their versions, firmware, kernel release."""
    accelerators = inventory.get("accelerators") or {}
    return {
        "cpu": {k: (inventory.get("cpu") or {}).get(k) for k in ("model", "flags", "microcode")},
        "cpu_budget": {
            k: (inventory.get("cpu_budget") or {}).get(k) for k in ("affinity", "cgroup_cpus")
        },
        "numa": [n.get("cpus") for n in inventory.get("numa") or []],
        "memory_total": (inventory.get("memory") or {}).get("total"),
        "hugepages_total": (inventory.get("hugepages") or {}).get("total"),
        "llama": (inventory.get("llama") or {}).get("features"),
        "accelerators": sorted(
            f"{d.get('vendor_id')}:{d.get('device_id')} {d.get('name')}"
            for d in accelerators.get("pci") or []
        ),
        "gpu_drivers": sorted(
            g.get("driver_version") or ""
            for g in (accelerators.get("nvidia_smi") or {}).get("gpus") or []
        ),
        "modules": _driver_modules((inventory.get("modules") or {}).get("loaded")),
        "firmware": inventory.get("firmware"),
        "kernel": (inventory.get("kernel") or {}).get("release"),
    }


def _driver_modules(loaded: Any) -> dict[str, str] | None:
    """The modules whose change matters: those with a version (out-of-tree drivers such as
    nvidia) and the accelerator drivers; a routine load (veth, loop) is not a change."""
    if not isinstance(loaded, dict):
        return None
    return {n: v for n, v in loaded.items() if v or n in ACCELERATOR_MODULES}


def fingerprint(inventory: dict[str, Any]) -> str:
    """sha256 (hex) of the canonical JSON of ``identity(inventory)``."""
    canonical = json.dumps(identity(inventory), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """What changed between two inventories' identities, as ``[{"path": "firmware.bios_version",
    "before": "1.2", "after": "1.3"}]`` sorted by path (a module that came or went has None on
    one side; a list's change adds ``added`` and ``removed``)."""
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    _flatten(identity(before), "", old)
    _flatten(identity(after), "", new)
    return [
        _change(path, old.get(path), new.get(path))
        for path in sorted(set(old) | set(new))
        if old.get(path) != new.get(path)
    ]


def _change(path: str, before: Any, after: Any) -> dict[str, Any]:
    """One change; a list (CPU flags, accelerators) also says what was ``added`` and
    ``removed``."""
    change = {"path": path, "before": before, "after": after}
    if isinstance(before, list) and isinstance(after, list):
        change["added"] = [x for x in after if x not in before]
        change["removed"] = [x for x in before if x not in after]
    return change
