"""This process's cgroup limits, read through a ``Host``: its CPU quota and its memory limit and
usage, the tightest along its cgroup path, for cgroup v2 and v1 alike."""

from __future__ import annotations

from nodes.devices.host import Host
from nodes.devices.sysfs import as_int, read_text


def _cgroup_paths(host: Host) -> dict[str, str]:
    """This process's cgroup path per controller from ``/proc/self/cgroup`` (``""``: v2)."""
    paths = {}
    for line in (host.read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    return paths


def _up_the_tree(mount: str, path: str) -> list[str]:
    """``mount + path`` and each of its ancestors up to ``mount`` (a limit set on a parent
    cgroup, a systemd slice or a Kubernetes pod, binds its children too)."""
    parts = [p for p in path.split("/") if p]
    return [f"{mount}/{'/'.join(parts[:i])}".rstrip("/") for i in range(len(parts), -1, -1)]


def cgroup_cpus(host: Host) -> tuple[float | None, str | None]:
    """The CPU quota of this process's cgroup in CPUs, the tightest along its path (``cpu.max``
    of cgroup v2, else ``cpu.cfs_quota_us / cpu.cfs_period_us`` of v1), with the file it
    comes from; ``(None, None)`` when unlimited or unknown."""
    paths = _cgroup_paths(host)
    found: list[tuple[float, str]] = []
    for base in _up_the_tree("/sys/fs/cgroup", paths.get("", "/")):
        quota = (read_text(host, f"{base}/cpu.max") or "").split()
        if len(quota) == 2 and quota[0] != "max" and as_int(quota[0]) and as_int(quota[1]):
            found.append((round(int(quota[0]) / int(quota[1]), 2), f"{base}/cpu.max"))
    for base in _up_the_tree("/sys/fs/cgroup/cpu", paths.get("cpu", "/")):
        quota_us = as_int(read_text(host, f"{base}/cpu.cfs_quota_us"))
        period_us = as_int(read_text(host, f"{base}/cpu.cfs_period_us"))
        if quota_us and quota_us > 0 and period_us:
            found.append((round(quota_us / period_us, 2), f"{base}/cpu.cfs_quota_us"))
    return min(found) if found else (None, None)


UNLIMITED_V1 = 1 << 62  # cgroup v1 writes a page-rounded 2^63 for "no limit"


def cgroup_memory(host: Host) -> tuple[int | None, int | None]:
    """``(limit, usage)`` in bytes of this process's cgroup memory, the tightest limit along
    its path (``memory.max`` / ``memory.current`` of v2, ``memory.limit_in_bytes`` /
    ``memory.usage_in_bytes`` of v1); None where unlimited or unknown."""
    paths = _cgroup_paths(host)
    found: list[tuple[int, int | None]] = []
    for base in _up_the_tree("/sys/fs/cgroup", paths.get("", "/")):
        limit = as_int(read_text(host, f"{base}/memory.max"))
        if limit:
            found.append((limit, as_int(read_text(host, f"{base}/memory.current"))))
    for base in _up_the_tree("/sys/fs/cgroup/memory", paths.get("memory", "/")):
        limit = as_int(read_text(host, f"{base}/memory.limit_in_bytes"))
        if limit and limit < UNLIMITED_V1:
            found.append((limit, as_int(read_text(host, f"{base}/memory.usage_in_bytes"))))
    return min(found, key=lambda f: f[0]) if found else (None, None)
