"""The llama.cpp section of a node's inventory: what its build was compiled with (the CPU
features it uses, ``AVX2 = 1``) and the backends it has, from llama.cpp's system info."""

from __future__ import annotations

from typing import Any

from nodes.devices.host import Host


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
