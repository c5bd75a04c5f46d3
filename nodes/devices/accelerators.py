"""The accelerators section of a node's inventory: display controllers and processing
accelerators on the PCI bus (``lspci -nn``), the GPUs the kernel set up (``/sys/class/drm``)
and what ``nvidia-smi`` says of them."""

from __future__ import annotations

import re
from typing import Any

from nodes.devices.host import Host
from nodes.devices.sysfs import read_text

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
                "vendor_id": _hex_id(read_text(host, f"{base}/vendor")),
                "device_id": _hex_id(read_text(host, f"{base}/device")),
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
