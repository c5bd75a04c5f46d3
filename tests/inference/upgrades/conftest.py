"""Fixtures of the upgrade tests: two approved package versions and three nodes on the old
one, simulated at the client seam (``tests.inference.upgrades.fakes.FakeNodes``)."""

from __future__ import annotations

import pytest

from inference.models import ModelPackage
from inference.packages.evaluation.smoke import SmokeResult
from inference.upgrades import driver
from nodes.models import Node
from tests.inference.upgrades.fakes import FakeNodes


@pytest.fixture
def packages(db):
    old = ModelPackage.objects.create(
        name="smol-q4_1", version="1", gguf_path="/x/old", sha256="a" * 64, status="approved"
    )
    new = ModelPackage.objects.create(
        name="smol-q4_k_m", version="1", gguf_path="/x/new", sha256="b" * 64, status="approved"
    )
    return old, new


@pytest.fixture
def fleet(packages, monkeypatch):
    old, _ = packages
    fake = FakeNodes()
    for i in (1, 2, 3):
        Node.objects.create(
            validation="passed",
            node_id=f"n{i}",
            address=f"127.0.0.1:{9400 + i}",
            package=old,
            state="up",
        )
        fake.serving[f"n{i}"] = old.sha256
    for name in ("package_switch", "package_state", "probe"):
        monkeypatch.setattr(driver.node_client, name, getattr(fake, name))

    class Http:
        def __init__(self, node_id):
            self.node_id = node_id

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(
        driver.node_client, "node_http", lambda address, node_id, timeout: Http(node_id)
    )

    def smoke(http):
        if fake.serving[http.node_id] in fake.broken:
            return SmokeResult(False, "tool_call: HTTP 400 template_error: boom", [])
        return SmokeResult(True, "", [{"name": "tool_call", "ok": True, "detail": ""}])

    monkeypatch.setattr(driver, "smoke_test", smoke)
    return fake
