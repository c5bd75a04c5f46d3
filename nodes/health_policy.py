"""The policy the health checks follow (interval, thresholds, timeouts): read through the
source the inference app registers in ``AppConfig.ready()`` (``RoutingPolicy.load``), so the
lower app imports no feature. A module of its own, light to import: ``ready()`` runs in every
process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from django.core.exceptions import ImproperlyConfigured


class HealthPolicy(Protocol):
    """What the loop reads of the routing policy (``inference.models.RoutingPolicy``)."""

    health_interval_s: float
    failure_threshold: int
    recovery_threshold: int
    probe_timeout_s: float
    canary_idle_s: float
    canary_timeout_s: float


_policy_sources: list[Callable[[], HealthPolicy]] = []


def register_policy_source(load: Callable[[], HealthPolicy]) -> None:
    """Let ``load()`` give the loop its policy, read afresh every tick (so policy edits apply);
    the inference app registers ``RoutingPolicy.load`` in ``AppConfig.ready()``, the way
    ``AUTHENTICATION_BACKENDS`` work. The last registered answers."""
    _policy_sources[:] = [load]


def health_policy() -> HealthPolicy:
    """The policy now. Raises ``ImproperlyConfigured`` when no app registered a source."""
    if not _policy_sources:
        raise ImproperlyConfigured("no policy source: the inference app registers one")
    return _policy_sources[-1]()


def health_interval_s() -> float:
    """Seconds between two health-check rounds (and the periodic work that follows them)."""
    return health_policy().health_interval_s
