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
    exported = yaml.safe_load(export_config())
    example = yaml.safe_load(ISSUE_EXAMPLE)
    assert exported["server"] == example["server"]
    assert exported["inference"] == example["inference"]
    for written, node in zip(exported["pool"]["nodes"], example["pool"]["nodes"], strict=True):
        assert written | node == written  # every key of the example, same value
    assert not apply_config_text(export_config()).changed


NON_DEFAULT_POLICY = {
    "session_header": "X-Agent-Session",
    "health_interval_s": 2.5,
    "failover_strategy": "stick_and_rebalance",
    "model_aliases": {"gpt-4o-mini": "smollm2-test"},
    "default_model": "smollm2-test",
    "failure_threshold": 4,
    "probe_timeout_s": 1.5,
    "connect_timeout_s": 1.5,
    "request_timeout_s": 90.0,
    "first_byte_floor_s": 4.0,
    "first_byte_margin": 2.5,
    "max_attempts": 2,
    "retry_backoff_ms": 80,
    "recovery_threshold": 3,
    "session_idle_release_s": 600.0,
    "overload_threshold": 2.0,
    "rebalance_target": 0.25,
    "move_cooldown_s": 60.0,
    "canary_idle_s": 30.0,
    "canary_timeout_s": 5.0,
    "max_inflight_per_node": 32,
    "max_inflight": 256,
    "queue_wait_s": 1.5,
}


def test_it_is_a_backup_of_every_policy_field_and_node_setting():
    from inference.models import ModelPackage

    package = ModelPackage.objects.create(
        name="smollm2-test", version="7", gguf_path="/x.gguf", sha256="0" * 64
    )
    editable = {f.name for f in RoutingPolicy._meta.concrete_fields} - {"id", "updated_at"}
    assert set(NON_DEFAULT_POLICY) == editable, "a new policy field needs a value here"
    RoutingPolicy.objects.filter(pk=RoutingPolicy.load().pk).update(**NON_DEFAULT_POLICY)
    Node.objects.create(
        validation="passed",
        node_id="node-05",
        address="127.0.0.5:8005",
        package=package,
        weight=2.5,
        affinity=False,
        cpu_set="0-1",
        threads=2,
        max_sessions=40,
        kv_budget_tokens=50000,
    )
    backup = export_config()
    assert not apply_config_text(backup, dry_run=True).changes  # unchanged: nothing to report
    RoutingPolicy.objects.all().delete()
    Node.objects.all().delete()
    report = apply_config_text(backup)
    assert report.created == ["node-05"]
    policy = RoutingPolicy.load()
    for name, value in NON_DEFAULT_POLICY.items():
        assert getattr(policy, name) == value, name
    node = Node.objects.get(node_id="node-05")
    assert (node.package_id, node.weight, node.affinity, node.cpu_set, node.threads) == (
        package.pk,
        2.5,
        False,
        "0-1",
        2,
    )
    assert (node.max_sessions, node.kv_budget_tokens) == (40, 50000)
    assert export_config() == backup


def test_a_dry_run_shows_each_change_before_and_after():
    apply_config_text(ISSUE_EXAMPLE)
    changed = ISSUE_EXAMPLE.replace(
        "weight: 10, affinity: true}\n    - {id: node-02",
        "weight: 4, affinity: true}\n    - {id: node-02",
    )
    changed += "routing: {max_attempts: 5, default_model: other}\n"
    report = apply_config_text(changed, dry_run=True)
    assert "node-01.weight: 10 \u2192 4" in report.changes
    assert "routing.max_attempts: 3 \u2192 5" in report.changes
    assert "routing.default_model: (none) \u2192 other" in report.changes
    assert Node.objects.get(node_id="node-01").weight == 10  # a dry run writes nothing


def test_a_policy_value_out_of_bounds_names_its_line():
    with pytest.raises(ConfigError) as info:
        apply_config_text("routing:\n  max_attempts: 2\n  canary_timeout_s: 100000\n")
    assert info.value.field == "routing.canary_timeout_s" and info.value.line == 3


def test_it_updates_and_prunes():
    apply_config_text(ISSUE_EXAMPLE)
    Node.objects.create(validation="passed", node_id="extra", address="127.0.0.13:1")
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
        # a tag that cannot build its value (was a 500 from the API)
        (
            "quotas:\n  roles:\n    viewer: {priority: !!int 'abc'}\n",
            3,
            "quotas.roles.viewer.priority",
        ),
        ("inference:\n  max_batch: !!timestamp 'abc'\n", 2, "inference.max_batch"),
        (
            "pool:\n  health_check_interval_ms: !!python/object:os.system x\n",
            2,
            "pool.health_check_interval_ms",
        ),
    ],
)
def test_it_names_line_and_field_of_each_error(text, line, field):
    with pytest.raises(ConfigError) as caught:
        apply_config_text(text)  # parse errors, and those only an apply can see (a new node)
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
    assert (
        yaml.safe_load(exported.read_text())["inference"]
        == yaml.safe_load(ISSUE_EXAMPLE)["inference"]
    )
    out = StringIO()
    call_command("applyconfig", str(exported), stdout=out)
    assert "nothing to change" in out.getvalue()
    path.write_text("pool: {nodes: [{id: x, address: bad}]}\n")
    with pytest.raises(CommandError, match=r"line 1, pool.nodes\[0\].address"):
        call_command("applyconfig", str(path))


def test_a_node_entry_may_leave_out_what_it_keeps():
    apply_config_text(ISSUE_EXAMPLE)
    report = apply_config_text("pool:\n  nodes:\n    - {id: node-01, weight: 4}\n")
    assert report.updated == ["node-01"] and report.changes == ["node-01.weight: 10 \u2192 4"]
    assert Node.objects.get(node_id="node-01").address == "127.0.0.11:9391"
    with pytest.raises(ConfigError) as info:
        apply_config_text("pool:\n  nodes:\n    - {id: node-new, weight: 4}\n")
    assert info.value.field == "pool.nodes[0].address" and info.value.line == 3


EXTERNAL_EXAMPLE = """\
pool:
  nodes:
    - {id: node-01, address: 127.0.0.11:9391}
    - {id: gpu-1, kind: external, served_name: llama-3.1-70b, address: 198.18.0.20:8080}
inference:
  model_path: /opt/models/agent-q4_k_m.gguf
"""


def test_an_external_node_round_trips_with_its_model_and_takes_no_package():
    from inference.models import ModelPackage

    ModelPackage.objects.create(
        name="agent-q4_k_m", version="1", gguf_path="/opt/models/agent-q4_k_m.gguf", sha256=""
    )
    assert apply_config_text(EXTERNAL_EXAMPLE).created == ["node-01", "gpu-1"]
    gpu = Node.objects.get(node_id="gpu-1")
    assert (gpu.kind, gpu.served_name, gpu.package, gpu.validation) == (
        "external",
        "llama-3.1-70b",
        None,
        "waived",
    )
    written = {n["id"]: n for n in yaml.safe_load(export_config())["pool"]["nodes"]}
    assert "kind" not in written["node-01"] and written["node-01"]["package"] == "agent-q4_k_m:1"
    assert written["gpu-1"]["kind"] == "external" and "package" not in written["gpu-1"]
    assert written["gpu-1"]["served_name"] == "llama-3.1-70b"
    assert not apply_config_text(export_config()).changed


@pytest.mark.parametrize(
    ("entry", "field", "says"),
    [
        ("{id: g, kind: gpu, address: 127.0.0.1:1}", "pool.nodes[0].kind", "phalanx or external"),
        ("{id: g, kind: external, address: 127.0.0.1:1}", "pool.nodes[0].served_name", "required"),
        (
            "{id: g, served_name: 'a b', address: 127.0.0.1:1}",
            "pool.nodes[0].served_name",
            "no spaces",
        ),
    ],
)
def test_a_bad_kind_or_served_name_names_its_field(entry, field, says):
    with pytest.raises(ConfigError) as bad:
        apply_config_text(f"pool:\n  nodes:\n    - {entry}\n")
    assert bad.value.field == field and says in bad.value.message
