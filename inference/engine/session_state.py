"""A session's KV state as bytes, for moving it between nodes (the node API's
/sessions/<id> export and import)."""

from __future__ import annotations

import json
import struct

from inference.engine.host_store import HostEntry

_MAGIC = b"PHXKV1\n"


def pack_state(entry: HostEntry, *, model_sha256: str = "") -> bytes:
    """Serialize a session state: magic, 4-byte header length, JSON header, llama.cpp blob."""
    header = json.dumps({"tokens": entry.tokens, "model_sha256": model_sha256}).encode()
    return _MAGIC + struct.pack("<I", len(header)) + header + entry.blob


def unpack_state(data: bytes) -> tuple[HostEntry, str]:
    """Inverse of ``pack_state``; raises ``ValueError`` naming what is wrong with ``data``."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 4:
        raise ValueError("not a Phalanx session state (bad magic)")
    start = len(_MAGIC) + 4
    (size,) = struct.unpack("<I", data[len(_MAGIC) : start])
    try:
        header = json.loads(data[start : start + size])
        tokens = [int(t) for t in header["tokens"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"session state header is invalid: {exc}") from exc
    return HostEntry(tokens=tokens, blob=data[start + size :]), str(header.get("model_sha256", ""))
