"""A node's inventory as a person reads it: one line of text per section, "unknown" where it is."""

from __future__ import annotations

from typing import Any


def _gib(n: Any) -> str:
    return f"{n / 1024**3:.1f} GiB" if isinstance(n, int | float) else "unknown"


def _cpu_lists(cpus: list[int] | None) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    if not cpus:
        return "unknown"
    runs: list[str] = []
    start = prev = cpus[0]
    for cpu in [*cpus[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        runs.append(f"{start}-{prev}" if prev != start else str(start))
        if cpu is not None:
            start = prev = cpu
    return ",".join(runs)


SIMD_SHOWN = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "amx_int8",
    "asimd",
    "asimddp",
    "i8mm",
    "sve",
)


def _known(value: Any, otherwise: str = "unknown") -> str:
    return otherwise if value is None else str(value)


def _section(inventory: dict[str, Any], name: str) -> dict[str, Any]:
    value = inventory.get(name)
    return value if isinstance(value, dict) else {}


def _cpu_text(inv: dict[str, Any]) -> str:
    cpu = _section(inv, "cpu")
    return f"{cpu.get('model') or 'unknown'} ({cpu.get('arch') or '?'})"


def _cores_text(inv: dict[str, Any]) -> str:
    cpu = _section(inv, "cpu")
    return f"{cpu.get('physical') or '?'} physical, {cpu.get('logical') or '?'} logical"


def _simd_text(inv: dict[str, Any]) -> str:
    flags = _section(inv, "cpu").get("flags") or []
    return ", ".join(f for f in SIMD_SHOWN if f in flags) or "none of the ones llama.cpp uses"


def _budget_text(inv: dict[str, Any]) -> str:
    budget = _section(inv, "cpu_budget")
    return (
        f"{_known(budget.get('cpus'))} (affinity {_cpu_lists(budget.get('affinity'))}, "
        f"cgroup {_known(budget.get('cgroup_cpus'), 'no quota')})"
    )


def _numa_text(inv: dict[str, Any]) -> str:
    nodes = inv.get("numa") or []
    parts = [
        f"node {n.get('node')}: CPUs {_cpu_lists(n.get('cpus'))}, {_gib(n.get('memory_bytes'))}"
        for n in nodes
    ]
    return "; ".join(parts) or "unknown"


def _memory_text(inv: dict[str, Any]) -> str:
    memory = _section(inv, "memory")
    text = f"{_gib(memory.get('total'))} total, {_gib(memory.get('available'))} available"
    limit = memory.get("cgroup_limit")
    return f"{text}, cgroup limit {_gib(limit)}" if limit else text


def _hugepages_text(inv: dict[str, Any]) -> str:
    huge = _section(inv, "hugepages")
    return f"{_known(huge.get('total'))} × {huge.get('size_kib') or '?'} KiB"


def _llama_text(inv: dict[str, Any]) -> str:
    llama = _section(inv, "llama")
    on = [name for name, value in (llama.get("features") or {}).items() if value == "1"]
    return f"{', '.join(llama.get('backends') or []) or 'unknown'}: {', '.join(on) or 'unknown'}"


def _accelerators_text(inv: dict[str, Any]) -> str:
    acc = _section(inv, "accelerators")
    pci = [
        f"{d.get('name')} [{d.get('vendor_id')}:{d.get('device_id')}]" for d in acc.get("pci") or []
    ]
    smi = [
        f"{g.get('name')} driver {g.get('driver_version')}"
        for g in (acc.get("nvidia_smi") or {}).get("gpus") or []
    ]
    lspci = acc.get("lspci") or {}
    fallback = "none" if lspci.get("status") == "ok" else f"unknown ({lspci.get('detail')})"
    return "; ".join(pci + smi) or fallback


def _modules_text(inv: dict[str, Any]) -> str:
    modules = _section(inv, "modules")
    if modules.get("status") != "ok":
        return "unknown (/proc/modules cannot be read)"
    return f"{len(modules.get('loaded') or {})} loaded"


def _firmware_text(inv: dict[str, Any]) -> str:
    firmware = _section(inv, "firmware")
    parts = [
        str(firmware[k]) for k in ("bios_vendor", "bios_version", "bios_date") if firmware.get(k)
    ]
    return " ".join(parts) or "unknown (no /sys/class/dmi)"


def _kernel_errors_text(inv: dict[str, Any]) -> str:
    errors = _section(inv, "kernel_errors")
    if errors.get("status") == "ok":
        return f"{errors.get('count')} since boot"
    return f"unknown: {errors.get('detail') or errors.get('status')}"


SUMMARY_ROWS = (
    ("CPU", _cpu_text),
    ("Cores", _cores_text),
    ("SIMD", _simd_text),
    ("CPU budget", _budget_text),
    ("NUMA", _numa_text),
    ("Memory", _memory_text),
    ("Hugepages", _hugepages_text),
    ("llama.cpp", _llama_text),
    ("Accelerators", _accelerators_text),
    ("Kernel modules", _modules_text),
    ("Firmware", _firmware_text),
    ("Kernel", lambda inv: _known(_section(inv, "kernel").get("release"))),
    ("Kernel errors", _kernel_errors_text),
)


def summary(inventory: dict[str, Any]) -> list[tuple[str, str]]:
    """The inventory as a person reads it: ``[(label, text)]``, "unknown" where it is; a
    section of the wrong shape reads as unknown too."""
    inventory = inventory if isinstance(inventory, dict) else {}
    return [(label, text(inventory)) for label, text in SUMMARY_ROWS]
