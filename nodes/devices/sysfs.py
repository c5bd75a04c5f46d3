"""Reading ``/proc`` and ``/sys`` values through a ``Host``: a file's stripped text, a number,
a CPU list; None (or ``[]``) where the source is missing or unreadable, never an exception."""

from __future__ import annotations

from nodes.devices.host import Host


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


def as_int(text: str | None) -> int | None:
    """``text`` as a whole number; None when it is not one."""
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def read_text(host: Host, path: str) -> str | None:
    """The file's text, stripped; None when it is missing, unreadable or blank."""
    raw = host.read(path)
    return raw.strip() if raw is not None and raw.strip() else None
