"""A node's inventory: what its machine is, read through a ``Host`` (``nodes.devices.host``).

``collect(host)`` returns plain JSON data (shape below); every section that could not be read
says so (``None``, ``[]`` or a ``status`` other than "ok") instead of raising. ``identity()`` is
the part whose change means the node must prove itself again (firmware, modules, kernel, CPU,
budget, accelerators, llama.cpp's build); ``diff()`` lists what changed between two identities.

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
import re
from typing import Any

from nodes.devices.host import Host

DMI_FIELDS = (
    "bios_vendor",
    "bios_version",
    "bios_date",
    "board_vendor",
    "board_name",
    "product_name",
)
# modules whose version ``modinfo`` is asked for when /sys/module does not give one
ACCELERATOR_MODULES = ("nvidia", "amdgpu", "i915", "xe", "habanalabs", "intel_vpu")
MAX_ERROR_LINES = 20


def parse_cpu_list(text: str | None) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``; [] for None or anything unreadable."""
    cpus: set[int] = set()
    for part in (text or "").strip().split(","):
        if not part:
            continue
        try:
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
        except ValueError:
            return []
    return sorted(cpus)


def _int(text: str | None) -> int | None:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def _text(host: Host, path: str) -> str | None:
    raw = host.read(path)
    return raw.strip() if raw is not None and raw.strip() else None


# CPU --------------------------------------------------------------------------------------


def cpu_section(host: Host, info: dict[str, Any]) -> dict[str, Any]:
    """Model, architecture and flags (py-cpuinfo), logical and physical cores (sysfs
    topology), microcode revision (``/proc/cpuinfo``)."""
    logical_dirs = [
        n for n in host.listdir("/sys/devices/system/cpu") if re.fullmatch(r"cpu\d+", n)
    ]
    cores = {
        _text(host, f"/sys/devices/system/cpu/{n}/topology/core_cpus_list")
        or _text(host, f"/sys/devices/system/cpu/{n}/topology/thread_siblings_list")
        for n in logical_dirs
    }
    cores.discard(None)
    microcode = re.search(r"^microcode\s*:\s*(\S+)", host.read("/proc/cpuinfo") or "", re.M)
    flags = info.get("flags")
    return {
        "model": info.get("brand_raw") or None,
        "arch": info.get("arch_string_raw") or None,
        "flags": sorted(flags) if isinstance(flags, list) else [],
        "logical": len(logical_dirs) or _int(info.get("count")),
        "physical": len(cores) or None,
        "microcode": microcode.group(1) if microcode else None,
    }


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


def _cgroup_cpus(host: Host) -> tuple[float | None, str | None]:
    """The CPU quota of this process's cgroup in CPUs, the tightest along its path (``cpu.max``
    of cgroup v2, else ``cpu.cfs_quota_us / cpu.cfs_period_us`` of v1), with the file it
    comes from; ``(None, None)`` when unlimited or unknown."""
    paths = _cgroup_paths(host)
    found: list[tuple[float, str]] = []
    for base in _up_the_tree("/sys/fs/cgroup", paths.get("", "/")):
        quota = (_text(host, f"{base}/cpu.max") or "").split()
        if len(quota) == 2 and quota[0] != "max" and _int(quota[0]) and _int(quota[1]):
            found.append((round(int(quota[0]) / int(quota[1]), 2), f"{base}/cpu.max"))
    for base in _up_the_tree("/sys/fs/cgroup/cpu", paths.get("cpu", "/")):
        quota_us = _int(_text(host, f"{base}/cpu.cfs_quota_us"))
        period_us = _int(_text(host, f"{base}/cpu.cfs_period_us"))
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
        limit = _int(_text(host, f"{base}/memory.max"))
        if limit:
            found.append((limit, _int(_text(host, f"{base}/memory.current"))))
    for base in _up_the_tree("/sys/fs/cgroup/memory", paths.get("memory", "/")):
        limit = _int(_text(host, f"{base}/memory.limit_in_bytes"))
        if limit and limit < UNLIMITED_V1:
            found.append((limit, _int(_text(host, f"{base}/memory.usage_in_bytes"))))
    return min(found, key=lambda f: f[0]) if found else (None, None)


def memory_section(host: Host) -> dict[str, Any]:
    """Total and available memory (psutil, bytes) and the cgroup's limit and usage."""
    limit, usage = cgroup_memory(host)
    return {**host.memory(), "cgroup_limit": limit, "cgroup_usage": usage}


def cpu_budget_section(host: Host) -> dict[str, Any]:
    """The CPUs this process can really use: its affinity and its cgroup's quota; ``cpus`` is
    the smaller of the two (None when neither is known)."""
    affinity = host.affinity()
    quota, source = _cgroup_cpus(host)
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


def llama_section(host: Host) -> dict[str, Any]:
    """llama.cpp's system info: ``features`` as it prints them (``AVX2 = 1``) and the
    backends it names (``CPU``, ``CUDA``...) before each ``:``."""
    text = host.llama_system_info()
    features: dict[str, str] = {}
    backends: list[str] = []
    for part in (text or "").split("|"):
        head, _, tail = part.rpartition(":")
        if head.strip() and head.strip() not in backends and "=" not in head:
            backends.append(head.strip())
        name, eq, value = (tail if head else part).partition("=")
        if eq and name.strip():
            features[name.strip()] = value.strip()
    return {"text": text, "features": features, "backends": backends}


# Accelerators ---------------------------------------------------------------------------

_LSPCI = re.compile(
    r"^(?P<slot>\S+)\s+(?P<cls>[^\[]+?)\s*\[(?P<code>[0-9a-fA-F]{4})\]:\s*(?P<name>.*?)\s*"
    r"\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]"
)
ACCELERATOR_CLASSES = ("03", "12")  # display controllers, processing accelerators


def parse_lspci(output: str) -> list[dict[str, str]]:
    """Display controllers and processing accelerators from ``lspci -nn``."""
    devices = []
    for line in output.splitlines():
        match = _LSPCI.match(line.strip())
        if match and match.group("code")[:2] in ACCELERATOR_CLASSES:
            devices.append(
                {
                    "slot": match.group("slot"),
                    "class": match.group("cls").strip(),
                    "class_code": match.group("code").lower(),
                    "vendor_id": match.group("vendor").lower(),
                    "device_id": match.group("device").lower(),
                    "name": match.group("name").strip(),
                }
            )
    return devices


def _hex_id(text: str | None) -> str | None:
    return text.lower().removeprefix("0x") if text else None


def drm_section(host: Host) -> list[dict[str, Any]]:
    """GPUs the kernel set up (``/sys/class/drm/cardN``) with their PCI ids and driver."""
    cards = []
    for name in host.listdir("/sys/class/drm"):
        if not re.fullmatch(r"card\d+", name):
            continue
        base = f"/sys/class/drm/{name}/device"
        driver = re.search(r"^DRIVER=(\S+)", host.read(f"{base}/uevent") or "", re.M)
        cards.append(
            {
                "card": name,
                "vendor_id": _hex_id(_text(host, f"{base}/vendor")),
                "device_id": _hex_id(_text(host, f"{base}/device")),
                "driver": driver.group(1) if driver else None,
            }
        )
    return cards


def nvidia_smi_section(host: Host) -> dict[str, Any]:
    result = host.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    )
    gpus = []
    for line in result.output.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            gpus.append({"name": parts[0], "driver_version": parts[1], "memory": parts[2]})
    return {"status": result.status, "detail": result.detail, "gpus": gpus}


def accelerators_section(host: Host) -> dict[str, Any]:
    lspci = host.run(["lspci", "-nn"])
    return {
        "lspci": {"status": lspci.status, "detail": lspci.detail},
        "pci": parse_lspci(lspci.output),
        "drm": drm_section(host),
        "nvidia_smi": nvidia_smi_section(host),
    }


# Kernel, modules, firmware ----------------------------------------------------------------


def modules_section(host: Host) -> dict[str, Any]:
    """Loaded modules (``/proc/modules``) with their version (``/sys/module/NAME/version``,
    or ``modinfo`` for accelerator drivers); "" when a module has none."""
    text = host.read("/proc/modules")
    if text is None:
        return {"status": "unknown", "detail": "/proc/modules cannot be read", "loaded": {}}
    loaded: dict[str, str] = {}
    for line in text.splitlines():
        name = line.split(" ", 1)[0].strip()
        if not name:
            continue
        version = _text(host, f"/sys/module/{name}/version")
        if version is None and name in ACCELERATOR_MODULES:
            info = host.run(["modinfo", "-F", "version", name])
            version = info.output.strip() or None
        loaded[name] = version or ""
    return {"status": "ok", "detail": "", "loaded": loaded}


def firmware_section(host: Host) -> dict[str, str | None]:
    return {name: _text(host, f"/sys/class/dmi/id/{name}") for name in DMI_FIELDS}


def kernel_errors_section(host: Host) -> dict[str, Any]:
    """Kernel messages at level err or worse since boot (``dmesg``); "not permitted" (for
    instance ``kernel.dmesg_restrict``) is a result, not a failure."""
    result = host.run(["dmesg", "--level=emerg,alert,crit,err", "--notime"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    return {
        "status": result.status,
        "detail": result.detail,
        "count": len(lines) if result.ok else None,
        "lines": lines[:MAX_ERROR_LINES],
    }


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
