"""Nodes simulated at the client seam (``nodes.client``) for the upgrade driver's tests, and
the health loop's part played by hand (``scrape``, ``run_to_end``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.utils import timezone

from inference.models import Upgrade
from inference.upgrades import driver
from nodes.client import ProbeResult
from nodes.models import Node


@dataclass
class FakeNodes:
    """What each node serves (sha256, with its engine settings) and its last switch; loads
    end at the next look."""

    serving: dict[str, str] = field(default_factory=dict)
    switches: dict[str, dict] = field(default_factory=dict)
    cannot_load: set[str] = field(default_factory=set)  # sha256s that fail to load
    broken: set[str] = field(default_factory=set)  # sha256s whose smoke test fails
    asked: list[tuple[str, str]] = field(default_factory=list)
    settings: dict[str, dict] = field(default_factory=dict)  # node_id -> settings it runs
    asked_settings: list[tuple[str, dict]] = field(default_factory=list)
    loading_settings: dict[str, dict] = field(default_factory=dict)  # of the load under way

    def package_switch(self, address, *, node_id, model_path, package, sha256, settings=None):
        self.asked.append((node_id, sha256))
        self.asked_settings.append((node_id, dict(settings or {})))
        self.switches[node_id] = {"sha256": sha256, "state": "loading", "error": ""}
        self.loading_settings[node_id] = dict(settings or {})
        return {}

    def package_state(self, address, *, node_id, timeout=5.0):
        switch = self.switches.get(node_id)
        if switch and switch["state"] == "loading":
            if switch["sha256"] in self.cannot_load:
                switch.update(state="failed", error="llama.cpp: bad magic")
            else:
                switch["state"] = "done"
                self.serving[node_id] = switch["sha256"]
                self.settings[node_id] = {
                    **self.settings.get(node_id, {}),
                    **self.loading_settings.pop(node_id, {}),
                }
        return {
            "sha256": self.serving[node_id],
            "switch": switch,
            "settings": self.settings.get(node_id, {}),
        }

    def probe(self, address, *, node_id, timeout):
        return ProbeResult(True, "ok")


def scrape():
    """As the health loop would: every node answered, idle, just now."""
    for node in Node.objects.all():
        if node.state == "unknown":
            node.state = "up"
        node.last_probe_at = timezone.now()
        node.last_seen_load = {"active": 0, "queue": 0, "requests": 0}
        node.save()


def run_to_end(upgrade: Upgrade, limit: int = 200) -> Upgrade:
    for _ in range(limit):
        scrape()
        driver.upgrades_tick()
        upgrade = Upgrade.objects.get(pk=upgrade.pk)
        if upgrade.finished:
            scrape()  # the undrained nodes are seen up
            return upgrade
    raise AssertionError(f"not finished: {Upgrade.objects.get(pk=upgrade.pk).nodes}")
