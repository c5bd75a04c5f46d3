"""Shared prefixes registered by operators (inference/prefixes): what registration refuses,
and, with a real node and the bundled model, that the control loop's periodic sends a
registered opening to the node serving its model, which then publishes it (placement and the
page read that) and is not sent it again."""

from __future__ import annotations

import pytest

from console.lib.errors import Conflict, Invalid
from inference.agent_prefix import agent_fingerprint
from inference.models import ModelPackage, SharedPrefix
from inference.prefixes import services
from nodes.control import ControlLoop
from nodes.models import Node
from tests.inference.conftest import NODE_ARGS, PACKAGE, address
from tests.support.processes import start_node
from tests.support.validation import mark_validated

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = "You are the billing agent. Look invoices up before you answer. " * 4
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "invoice_find",
            "description": "Find an invoice by its number.",
            "parameters": {"type": "object", "properties": {"number": {"type": "string"}}},
        },
    }
]


def _register(**changes):
    fields = {"name": "billing", "model": "", "system": SYSTEM, "tools": TOOLS, **changes}
    return services.prefix_register(**fields)


@pytest.mark.parametrize(
    "changes, field, says",
    [
        ({"system": "  "}, "system", "must not be empty"),
        ({"system": "x" * (64 * 1024 + 1)}, "system", "at most"),
        ({"tools": [{"type": "function"}]}, "tools", "tools"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "tools"),
        ({"model": "no-such-model"}, "model", "does not exist"),
    ],
)
def test_registration_refuses_what_a_request_would_not_take(changes, field, says) -> None:
    with pytest.raises(Invalid) as refused:
        _register(**changes)
    assert refused.value.field.startswith(field) and says in refused.value.message
    assert not SharedPrefix.objects.exists()


def test_a_name_is_registered_once_and_at_most_eight_are_kept() -> None:
    first = _register()
    assert first.agent == agent_fingerprint([{"role": "system", "content": SYSTEM}], TOOLS)
    with pytest.raises(Conflict):
        _register()
    for i in range(services.MAX_REGISTERED - 1):
        _register(name=f"agent-{i}", system=f"Agent number {i}.")
    with pytest.raises(Conflict) as refused:
        _register(name="one-too-many")
    assert refused.value.code == "too_many_prefixes"


@pytest.mark.model
def test_the_control_loop_sends_a_registered_opening_to_the_node_serving_its_model(
    tmp_path,
) -> None:
    args = [*NODE_ARGS, "--prefix-dir", str(tmp_path / "shelf")]
    proc = start_node("prefix-node", tmp_path, extra_args=args)
    try:
        package = ModelPackage.objects.create(
            name=PACKAGE, version="1", gguf_path="x", sha256="", family="smollm2-135m-instruct"
        )
        Node.objects.create(node_id="prefix-node", address=address(proc), package=package)
        mark_validated("prefix-node", proc.url)
        ControlLoop().tick()
        for_it = _register(model="smollm2-135m-instruct")
        _register(name="other-model", system="Another agent.", model="")
        [view, other] = sorted(services.prefixes_overview(), key=lambda v: v.prefix.name)
        assert view.waiting == ["prefix-node"] and view.held_by == []
        assert services.prefixes_send_due() == 2
        ControlLoop().tick()  # the node's /metrics now publish both agents
        views = {v.prefix.name: v for v in services.prefixes_overview()}
        assert views["billing"].held_by == ["prefix-node"] and not views["billing"].waiting
        assert for_it.agent in Node.objects.get(node_id="prefix-node").last_seen_load["prefixes"]
        assert services.prefixes_send_due() == 0  # nothing is sent twice
    finally:
        proc.stop()


def test_a_prefix_for_another_model_is_not_sent(tmp_path) -> None:
    package = ModelPackage.objects.create(name="m-a", version="1", gguf_path="x", sha256="")
    Node.objects.create(
        node_id="n-1", address="127.0.0.1:9", package=package, state="up", validation="passed"
    )
    ModelPackage.objects.create(name="m-b", version="1", gguf_path="x", sha256="")
    Node.objects.create(
        node_id="n-2",
        address="127.0.0.1:9",
        package=ModelPackage.objects.get(name="m-b"),
        state="up",
        validation="passed",
    )
    _register(model="m-b")
    [view] = services.prefixes_overview()
    assert view.waiting == ["n-2"]  # n-1 serves m-a
    assert services.prefixes_send_due() == 0  # n-2 cannot be reached: tried again later
