"""The kernel's sections of a node's inventory: loaded modules and their versions, firmware
(DMI), and the kernel's error messages since boot."""

from __future__ import annotations

from typing import Any

from nodes.devices.host import Host
from nodes.devices.sysfs import read_text

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
        version = read_text(host, f"/sys/module/{name}/version")
        if version is None and name in ACCELERATOR_MODULES:
            info = host.run(["modinfo", "-F", "version", name])
            version = info.output.strip() or None
        loaded[name] = version or ""
    return {"status": "ok", "detail": "", "loaded": loaded}


def firmware_section(host: Host) -> dict[str, str | None]:
    return {name: read_text(host, f"/sys/class/dmi/id/{name}") for name in DMI_FIELDS}


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
