"""The control plane's metrics registry and its Prometheus text at ``/metrics`` (format 0.0.4),
so an existing Prometheus/Grafana can watch the array.

Each app registers what it exposes in its ``AppConfig.ready()`` (the plumbing imports no app):
``register_collector(fn)`` for families read from the database on each scrape (so every replica
answers the same; ``fn(write)`` calls ``write(name, kind, help, samples)``), and
``register_counter(name, help)`` for counters with no table behind them, bumped with
``metric_inc(name)`` and kept in the cache (shared by replicas with Redis).
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.cache import cache

Samples = list[tuple[dict[str, str], float]]
Write = Callable[[str, str, str, Samples], None]
Collector = Callable[[Write], None]

_PREFIX = "phalanx:metric:"
_collectors: list[Collector] = []
_counters: dict[str, str] = {}  # name -> help


def register_collector(collector: Collector) -> None:
    """Add ``collector`` to every scrape (once, however often an app registers it)."""
    if collector not in _collectors:
        _collectors.append(collector)


def register_counter(name: str, help_text: str) -> None:
    """Expose the cache counter ``name`` (bumped with ``metric_inc``) with ``help_text``."""
    _counters[name] = help_text


def metric_inc(name: str, amount: int = 1) -> None:
    """Add ``amount`` to the registered cache counter ``name`` (shared by replicas with
    Redis). Raises ``KeyError`` for a name nobody registered."""
    if name not in _counters:
        raise KeyError(f"no counter {name!r}: register_counter it first")
    key = _PREFIX + name
    if not cache.add(key, amount, timeout=None):
        try:
            cache.incr(key, amount)
        except ValueError:  # expired between add and incr
            cache.add(key, amount, timeout=None)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _writer(lines: list[str]) -> Write:
    def write(name: str, kind: str, help_text: str, samples: Samples) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        for labels, value in samples:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {value:g}" if text else f"{name} {value:g}")

    return write


def prometheus_text() -> str:
    """Every registered family, then every registered cache counter, as Prometheus text."""
    lines: list[str] = []
    write = _writer(lines)
    for collector in _collectors:
        collector(write)
    for name, help_text in _counters.items():
        write(name, "counter", help_text, [({}, cache.get(_PREFIX + name) or 0)])
    return "\n".join(lines) + "\n"
