"""The memory section of a node's inventory: total and available memory, the cgroup's limit and
usage, and hugepages."""

from __future__ import annotations

import re
from typing import Any

from nodes.devices.cgroups import cgroup_memory
from nodes.devices.host import Host


def memory_section(host: Host) -> dict[str, Any]:
    """Total and available memory (psutil, bytes) and the cgroup's limit and usage."""
    limit, usage = cgroup_memory(host)
    return {**host.memory(), "cgroup_limit": limit, "cgroup_usage": usage}


def hugepages_section(host: Host) -> dict[str, Any]:
    meminfo = host.read("/proc/meminfo") or ""

    def field(name: str) -> int | None:
        match = re.search(rf"^{name}:\s+(\d+)", meminfo, re.M)
        return int(match.group(1)) if match else None

    return {
        "total": field("HugePages_Total"),
        "free": field("HugePages_Free"),
        "size_kib": field("Hugepagesize"),
    }
