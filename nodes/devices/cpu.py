"""The CPU section of a node's inventory: the processor (model, flags, cores, microcode), the CPUs
this process may use (affinity and cgroup quota) and the NUMA layout."""

from __future__ import annotations

import re
from typing import Any

from nodes.devices.cgroups import cgroup_cpus
from nodes.devices.host import Host
from nodes.devices.sysfs import as_int, parse_cpu_list, read_text


def cpu_section(host: Host, info: dict[str, Any]) -> dict[str, Any]:
    """Model, architecture and flags (py-cpuinfo), logical and physical cores (sysfs
    topology), microcode revision (``/proc/cpuinfo``)."""
    logical_dirs = [
        n for n in host.listdir("/sys/devices/system/cpu") if re.fullmatch(r"cpu\d+", n)
    ]
    cores = {
        read_text(host, f"/sys/devices/system/cpu/{n}/topology/core_cpus_list")
        or read_text(host, f"/sys/devices/system/cpu/{n}/topology/thread_siblings_list")
        for n in logical_dirs
    }
    cores.discard(None)
    microcode = re.search(r"^microcode\s*:\s*(\S+)", host.read("/proc/cpuinfo") or "", re.M)
    flags = info.get("flags")
    return {
        "model": info.get("brand_raw") or None,
        "arch": info.get("arch_string_raw") or None,
        "flags": sorted(flags) if isinstance(flags, list) else [],
        "logical": len(logical_dirs) or as_int(info.get("count")),
        "physical": len(cores) or None,
        "microcode": microcode.group(1) if microcode else None,
    }


def cpu_budget_section(host: Host) -> dict[str, Any]:
    """The CPUs this process can really use: its affinity and its cgroup's quota; ``cpus`` is
    the smaller of the two (None when neither is known)."""
    affinity = host.affinity()
    quota, source = cgroup_cpus(host)
    known = [x for x in (len(affinity) if affinity else None, quota) if x is not None]
    return {
        "affinity": affinity,
        "cgroup_cpus": quota,
        "cgroup_source": source,
        "cpus": float(min(known)) if known else None,
    }


def numa_section(host: Host) -> list[dict[str, Any]]:
    """NUMA nodes from ``/sys/devices/system/node``: their CPUs and memory."""
    nodes = []
    for name in host.listdir("/sys/devices/system/node"):
        match = re.fullmatch(r"node(\d+)", name)
        if not match:
            continue
        base = f"/sys/devices/system/node/{name}"
        total_kib = re.search(r"MemTotal:\s+(\d+)\s*kB", host.read(f"{base}/meminfo") or "")
        nodes.append(
            {
                "node": int(match.group(1)),
                "cpus": parse_cpu_list(host.read(f"{base}/cpulist")),
                "memory_bytes": int(total_kib.group(1)) * 1024 if total_kib else None,
            }
        )
    return sorted(nodes, key=lambda n: n["node"])
