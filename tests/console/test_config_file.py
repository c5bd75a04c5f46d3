"""Config as a file: parse errors name line and field; apply is idempotent; export round-trips."""

from __future__ import annotations

from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command

from console.config_file import ConfigError, apply_config_text, export_config, parse_config
from console.models import ArrayConfig
from inference.models import RoutingPolicy
from nodes.models import Node

pytestmark = pytest.mark.django_db

ISSUE_EXAMPLE = """\
server: {listen: 127.0.0.1:9391, routing_key_header: X-Session-Id}
pool:
  nodes:
    - {id: node-01, address: 127.0.0.11:9391, weight: 10, affinity: true}
    - {id: node-02, address: 127.0.0.12:9391, weight: 10, affinity: true}
  health_check_interval_ms: 5000
  failover_strategy: stick_and_redirect
inference:
  model_path: /opt/models/agent-q4_k_m.gguf
  ai_module: device0,device1
  context_window: 4096
  max_batch: 32
"""


def test_it_applies_the_example_of_the_issue():
    report = apply_config_text(ISSUE_EXAMPLE)
    assert report.created == ["node-01", "node-02"]
    assert any("model_path" in w for w in report.warnings)
    node = Node.objects.get(node_id="node-02")
    assert (node.address, node.weight, node.affinity) == ("127.0.0.12:9391", 10, True)
    policy = RoutingPolicy.load()
    assert (policy.session_header, policy.health_interval_s) == ("X-Session-Id", 5.0)
    config = ArrayConfig.load()
    assert (config.listen, config.ai_modules, config.context_window, config.max_batch) == (
        "127.0.0.1:9391",
        "device0,device1",
        4096,
        32,
    )


def test_it_is_idempotent():
    apply_config_text(ISSUE_EXAMPLE)
    events = Node.objects.get(node_id="node-01").events.count()
    again = apply_config_text(ISSUE_EXAMPLE)
    assert not again.changed and again.unchanged == ["node-01", "node-02"]
    assert Node.objects.get(node_id="node-01").events.count() == events


def test_it_round_trips():
    apply_config_text(ISSUE_EXAMPLE)
    exported = export_config()
    assert yaml.safe_load(exported) == yaml.safe_load(ISSUE_EXAMPLE)
    assert not apply_config_text(exported).changed


def test_it_updates_and_prunes():
    apply_config_text(ISSUE_EXAMPLE)
    Node.objects.create(node_id="extra", address="127.0.0.13:1")
    changed = ISSUE_EXAMPLE.replace("127.0.0.12:9391, weight: 10", "127.0.0.12:9391, weight: 3")
    kept = apply_config_text(changed)
    assert kept.updated == ["node-02"] and Node.objects.filter(node_id="extra").exists()
    dry = apply_config_text(changed, prune=True, dry_run=True)
    assert dry.removed == ["extra"] and Node.objects.filter(node_id="extra").exists()
    assert apply_config_text(changed, prune=True).removed == ["extra"]
    assert not Node.objects.filter(node_id="extra").exists()
    assert Node.objects.get(node_id="node-02").weight == 3


def test_it_uses_a_package_with_the_model_path(db):
    from inference.models import ModelPackage

    package = ModelPackage.objects.create(
        name="agent", version="1", sha256="1" * 64, gguf_path="/opt/models/agent-q4_k_m.gguf"
    )
    report = apply_config_text(ISSUE_EXAMPLE)
    assert not report.warnings
    assert set(Node.objects.values_list("package_id", flat=True)) == {package.pk}


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("server: {listen: 127.0.0.1:9391, routing_key_headr: X}\n", 1, "server.routing_key_headr"),
        ("pool:\n  nodes:\n    - {id: a, address: nowhere}\n", 3, "pool.nodes[0].address"),
        ("pool:\n  nodes:\n    - {id: a}\n", 3, "pool.nodes[0].address"),
        (
            "pool:\n  nodes:\n    - {id: a, address: 127.0.0.1:1}\n    - {id: a, address: "
            "127.0.0.1:2}\n",
            4,
            "pool.nodes[1].id",
        ),
        ("pool:\n  health_check_interval_ms: fast\n", 2, "pool.health_check_interval_ms"),
        ("pool:\n  failover_strategy: random\n", 2, "pool.failover_strategy"),
        (
            "pool:\n  nodes:\n    - {id: a, address: 127.0.0.1:1, weight: -1}\n",
            3,
            "pool.nodes[0].weight",
        ),
        (
            "pool:\n  nodes:\n    - {id: a, address: 127.0.0.1:1, affinity: maybe}\n",
            3,
            "pool.nodes[0].affinity",
        ),
        ("inference:\n  max_batch: 0\n", 2, "inference.max_batch"),
        ("inference: [1, 2]\n", 1, "inference"),
        ("\n\nsurprise: 1\n", 3, "surprise"),
        ("pool:\n  nodes: {id: a}\n", 2, "pool.nodes"),
    ],
)
def test_it_names_line_and_field_of_each_error(text, line, field):
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert (caught.value.line, caught.value.field) == (line, field)
    assert str(caught.value).startswith(f"line {line}, {field}: ")


def test_it_names_the_line_of_broken_yaml():
    with pytest.raises(ConfigError) as caught:
        parse_config("pool:\n  nodes: [\n  oops: }\n")
    assert caught.value.line is not None and "not valid YAML" in str(caught.value)


def test_it_changes_nothing_when_a_file_is_bad():
    apply_config_text(ISSUE_EXAMPLE)
    with pytest.raises(ConfigError):
        apply_config_text(ISSUE_EXAMPLE.replace("max_batch: 32", "max_batch: -2"))
    assert ArrayConfig.load().max_batch == 32


def test_it_applies_and_exports_with_management_commands(tmp_path):
    path = tmp_path / "array.yaml"
    path.write_text(ISSUE_EXAMPLE)
    out = StringIO()
    call_command("applyconfig", str(path), stdout=out, stderr=StringIO())
    assert "created: node-01, node-02" in out.getvalue()
    out = StringIO()
    call_command("applyconfig", str(path), stdout=out)
    assert "nothing to change" in out.getvalue()
    exported = tmp_path / "out.yaml"
    call_command("exportconfig", "-o", str(exported))
    assert yaml.safe_load(exported.read_text()) == yaml.safe_load(ISSUE_EXAMPLE)
    path.write_text("pool: {nodes: [{id: x, address: bad}]}\n")
    with pytest.raises(CommandError, match=r"line 1, pool.nodes\[0\].address"):
        call_command("applyconfig", str(path))
