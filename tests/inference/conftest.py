from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from inference.models import ModelPackage, RoutingPolicy
from inference.tokens import token_create
from nodes.control import ControlLoop
from nodes.models import Node
from tests.fakenode import FakeNode
from tests.support.processes import Proc, start_node
from tests.support.validation import mark_validated

MODEL = "smollm2-test"
PACKAGE = "smollm2-135m-instruct-q4_1"  # the bundled model, served by real nodes
NODE_ARGS = ["--sequences", "4", "--ctx-per-seq", "1024", "--host-ram-mib", "64"]


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
        validation="passed",
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


# --- real node agents with the bundled model -------------------------------------------------


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fault-nodes")


@pytest.fixture(scope="module")
def steady(log_dir):
    """Two nodes that stay up for the whole module."""
    procs = [start_node(f"steady-{i}", log_dir, extra_args=NODE_ARGS) for i in (1, 2)]
    yield procs
    for proc in procs:
        proc.stop()


def address(proc: Proc) -> str:
    return proc.url.removeprefix("http://")


@sync_to_async
def inventory(*procs: Proc) -> str:
    package, _ = ModelPackage.objects.get_or_create(
        name=PACKAGE, version="1", defaults={"gguf_path": "x", "sha256": ""}
    )
    for proc in procs:
        node_id = proc.log_path.stem
        Node.objects.update_or_create(
            node_id=node_id, defaults={"address": address(proc), "package": package}
        )
        mark_validated(node_id, proc.url)  # the subject here is serving, not validation
    policy = RoutingPolicy.load()
    policy.request_timeout_s, policy.connect_timeout_s, policy.canary_idle_s = 30.0, 1.0, 0
    policy.save()
    ControlLoop().tick()
    return token_create(name="faults")[1]
