from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.utils import timezone

from inference.models import ModelPackage, RoutingPolicy
from inference.services import token_create
from nodes.models import Node
from tests.fakenode import FakeNode

MODEL = "smollm2-test"


@pytest.fixture
def package(transactional_db) -> ModelPackage:
    return ModelPackage.objects.create(
        name=MODEL, version="1", gguf_path="/tmp/x.gguf", sha256="0" * 64, quantization="Q4_1"
    )


@pytest.fixture
def policy(transactional_db) -> RoutingPolicy:
    policy = RoutingPolicy.load()
    policy.connect_timeout_s = 1.0
    policy.request_timeout_s = 5.0
    policy.save()
    return policy


def add_node(
    node_id: str,
    address: str,
    package: ModelPackage,
    *,
    load: float | None = 0.0,
    state: str = Node.State.UP,
) -> Node:
    return Node.objects.create(
        node_id=node_id,
        address=address,
        package=package,
        state=state,
        last_probe_at=timezone.now(),
        last_seen_load=None if load is None else {"load": load},
    )


@pytest.fixture
def fakes(package, policy) -> Iterator[dict[str, FakeNode]]:
    nodes = {name: FakeNode(name).start() for name in ("node-01", "node-02")}
    for name, fake in nodes.items():
        add_node(name, fake.address, package)
    yield nodes
    for fake in nodes.values():
        fake.stop()


@pytest.fixture
def token(transactional_db) -> str:
    return token_create(name="test")[1]


@pytest.fixture
def auth(token) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
