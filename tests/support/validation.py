"""Validation reports as a node agent sends them, built from the fixture machines
(tests/nodes/devices/machines) for control-plane and page tests."""

from __future__ import annotations

from pathlib import Path

from nodes.devices.host import RecordedHost
from nodes.devices.inventory import collect, fingerprint

MACHINES = Path(__file__).resolve().parents[1] / "nodes" / "devices" / "machines"


def machine_report(
    machine: str | Path, *, decode_8: float = 300.0, threads: int = 8, instance: str = "i-1"
) -> dict:
    """The report of a run on ``machine`` (a fixture machine's name or directory)."""
    inventory = collect(RecordedHost(machine if isinstance(machine, Path) else MACHINES / machine))
    return {
        "instance": instance,
        "fingerprint": fingerprint(inventory),
        "inventory": inventory,
        "engine": {
            "threads": threads,
            "sequences": 8,
            "ctx_per_seq": 2048,
            "kv_bytes_per_token": 24_576,
            "model_bytes": 100 << 20,
            "host_ram_bytes": 256 << 20,
            "held_bytes": 600 << 20,
            "quantization": "Q4_K_M",
        },
        "bench": {
            "memory_bandwidth_gb_s": 12.0,
            "prompt_tok_s": 2000.0,
            "decode_tok_s_1": 90.0,
            "decode_tok_s_8": decode_8,
        },
        "seconds": 9.5,
    }


def mark_validated(node_id: str, url: str) -> None:
    """Record the agent at ``url`` as validated (passed, with its instance and fingerprint from
    ``/health``), as if a run had just passed: for tests whose subject is not validation. A
    restart of that agent is then validated for real by the control loop."""
    import httpx

    from nodes.models import Node

    device = httpx.get(f"{url}/health", timeout=10).json()["device"]
    Node.objects.filter(node_id=node_id).update(
        validation="passed",
        device_instance=device["instance"],
        device_fingerprint=device["fingerprint"],
    )
