"""Parsing a config file (pure: no database): the values it yields, and for every mistake the
exact sentence an operator reads, with its line and field."""

from __future__ import annotations

import pytest

from console.config_file import ConfigError, parse_config
from console.config_file.spec import MAX_BYTES, NodeSpec

WHOLE = """\
server:
  listen: 127.0.0.1:9391
  routing_key_header: X-Agent-Id
pool:
  health_check_interval_ms: 100
  failover_strategy: stick_and_rebalance
  nodes:
    - id: node_01
      address: "[::1]:9401"
      weight: 0
      affinity: false
      cpu_set: 0-3,6
      threads: 1
      package: smol:1
      max_sessions: 0
      kv_budget_tokens: 0
    - {id: n2}
routing:
  failure_threshold: 4
  model_aliases: {gpt-4o: smol}
inference:
  model_path: /models/x.gguf
  ai_module: none
  context_window: 1
  max_batch: 1
"""


def test_it_reads_every_section() -> None:
    spec = parse_config(WHOLE)
    assert (spec.listen, spec.routing_key_header) == ("127.0.0.1:9391", "X-Agent-Id")
    assert (spec.health_check_interval_ms, spec.failover_strategy) == (100, "stick_and_rebalance")
    assert spec.nodes == [
        NodeSpec(
            node_id="node_01",
            address="[::1]:9401",
            weight=0.0,
            affinity=False,
            cpu_set="0-3,6",
            threads=1,
            package="smol:1",
            max_sessions=0,
            kv_budget_tokens=0,
            where="pool.nodes[0]",
            line=8,
        ),
        NodeSpec(node_id="n2", address=None, where="pool.nodes[1]", line=17),
    ]
    assert isinstance(spec.nodes[0].weight, float)
    assert spec.routing == {"failure_threshold": (4, 19), "model_aliases": ({"gpt-4o": "smol"}, 20)}
    assert (spec.model_path, spec.ai_module) == ("/models/x.gguf", "none")
    assert (spec.context_window, spec.max_batch) == (1, 1)


@pytest.mark.parametrize("text", ["", "# nothing\n", "\n\n"])
def test_an_empty_file_changes_nothing(text) -> None:
    spec = parse_config(text)
    assert spec.nodes is None and spec.routing is None and spec.listen is None


@pytest.mark.parametrize("empty", ["", "~", "null"])
def test_an_empty_node_list_is_no_nodes(empty) -> None:
    assert parse_config(f"pool:\n  nodes: {empty}\n").nodes == []


def test_numbers_may_be_whole_and_weights_fractional() -> None:
    spec = parse_config("pool:\n  nodes:\n    - {id: a, weight: 2.5, threads: 16}\n")
    assert (spec.nodes[0].weight, spec.nodes[0].threads) == (2.5, 16)
    assert parse_config("pool:\n  nodes:\n    - {id: a, weight: 3}\n").nodes[0].weight == 3.0


NODE = "pool:\n  nodes:\n    - {id: a, %s}\n"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[1]\n", "line 1: must be a mapping (key: value)."),
        ("~\n", "line 1: must be a mapping (key: value)."),
        (
            "surprise: 1\n",
            "line 1, surprise: unknown key; expected one of inference, pool, quotas, routing, server.",
        ),
        ("pool: {}\npool: {}\n", "line 2, pool: appears twice."),
        ("server: {listen: [1]}\n", "line 1, server.listen: must be a single value."),
        (
            "server: {listen: nowhere}\n",
            "line 1, server.listen: must be host:port, for example 127.0.0.1:9391.",
        ),
        ("server: {listen: true}\n", "line 1, server.listen: must be text."),
        ("server: {listen: ~}\n", "line 1, server.listen: must be text."),
        (
            "server: {routing_key_header: 'X Session'}\n",
            "line 1, server.routing_key_header: must be an HTTP header name such as X-Session-Id.",
        ),
        (
            "pool:\n  health_check_interval_ms: 99\n",
            "line 2, pool.health_check_interval_ms: must be a whole number >= 100.",
        ),
        (
            "pool:\n  health_check_interval_ms: true\n",
            "line 2, pool.health_check_interval_ms: must be a whole number >= 100.",
        ),
        (
            "pool:\n  failover_strategy: random\n",
            "line 2, pool.failover_strategy: must be one of stick_and_redirect, stick_and_rebalance, least_loaded.",
        ),
        ("pool:\n  nodes: {id: a}\n", "line 2, pool.nodes: must be a list of nodes."),
        (
            "pool:\n  nodes:\n    - {address: 127.0.0.1:1}\n",
            "line 3, pool.nodes[0].id: 'id' is required.",
        ),
        (
            "pool:\n  nodes:\n    - {id: 'a b'}\n",
            "line 3, pool.nodes[0].id: must be letters, digits, '-' or '_' (at most 64).",
        ),
        (
            "pool:\n  nodes:\n    - id: |\n        n1\n",
            "line 3, pool.nodes[0].id: must be letters, digits, '-' or '_' (at most 64).",
        ),
        (
            NODE % "address: nowhere",
            "line 3, pool.nodes[0].address: must be host:port, for example 127.0.0.1:9401.",
        ),
        (NODE % "weight: -0.5", "line 3, pool.nodes[0].weight: must be a number >= 0."),
        (NODE % "weight: yes", "line 3, pool.nodes[0].weight: must be a number >= 0."),
        (NODE % "weight: '2'", "line 3, pool.nodes[0].weight: must be a number >= 0."),
        (NODE % "affinity: 1", "line 3, pool.nodes[0].affinity: must be true or false."),
        (
            NODE % "cpu_set: 0-",
            "line 3, pool.nodes[0].cpu_set: must be a CPU list such as 0, 0-3 or 0,2.",
        ),
        (NODE % "threads: 0", "line 3, pool.nodes[0].threads: must be a whole number >= 1."),
        (NODE % "threads: 1.5", "line 3, pool.nodes[0].threads: must be a whole number >= 1."),
        (
            NODE % "max_sessions: -1",
            "line 3, pool.nodes[0].max_sessions: must be a whole number >= 0.",
        ),
        (
            NODE % "kv_budget_tokens: -1",
            "line 3, pool.nodes[0].kv_budget_tokens: must be a whole number >= 0.",
        ),
        (NODE % "package: {a: 1}", "line 3, pool.nodes[0].package: must be a single value."),
        (
            NODE % "colour: red",
            "line 3, pool.nodes[0].colour: unknown key; expected one of address, affinity, cpu_set, id, kind, kv_budget_tokens, max_sessions, package, served_name, threads, weight.",
        ),
        (
            "pool:\n  nodes:\n    - {id: a}\n    - {id: b}\n    - {id: a}\n",
            "line 5, pool.nodes[2].id: node id 'a' is also at line 3.",
        ),
        (
            "routing:\n  failure_threshold: [1]\n",
            "line 2, routing.failure_threshold: must be a single value.",
        ),
        (
            "routing:\n  model_aliases: !!python/name:os.system {}\n",
            "line 2, routing.model_aliases: not valid here: could not determine a constructor for the tag 'tag:yaml.org,2002:python/name:os.system'",
        ),
        (
            "inference:\n  context_window: 0\n",
            "line 2, inference.context_window: must be a whole number >= 1.",
        ),
        (
            "inference:\n  max_batch: 0\n",
            "line 2, inference.max_batch: must be a whole number >= 1.",
        ),
        (
            "inference:\n  model_path: [x]\n",
            "line 2, inference.model_path: must be a single value.",
        ),
        ("inference:\n  ai_module: false\n", "line 2, inference.ai_module: must be text."),
        (
            "pool:\n  nodes: [\n  oops: }\n",
            "line 3: not valid YAML: expected the node content, but found '}'",
        ),
        ("a: b: c\n", "line 1: not valid YAML: mapping values are not allowed here"),
        ("[" * 2000 + "]" * 2000, "the YAML nests too deeply."),
        ("a: \x07\n", "not valid YAML: unacceptable character #x0007"),
        ("? [a]\n: 1\n", "line 1: keys must be plain names."),
        ("pool:\n  ? {a: 1}\n  : 1\n", "line 2, pool: keys must be plain names."),
        ("pool: [1]\n", "line 1, pool: must be a mapping (key: value)."),
        (
            "pool:\n  nodez: 1\n",
            "line 2, pool.nodez: unknown key; expected one of failover_strategy, health_check_interval_ms, nodes.",
        ),
        ("pool:\n  nodes: x\n", "line 2, pool.nodes: must be a list of nodes."),
        (
            "pool:\n  failover_strategy: [x]\n",
            "line 2, pool.failover_strategy: must be a single value.",
        ),
        ("routing: 1\n", "line 1, routing: must be a mapping (key: value)."),
        ("routing:\n  colour: red\n", "line 2, routing.colour: unknown key; expected one of "),
        (NODE % "affinity: [true]", "line 3, pool.nodes[0].affinity: must be a single value."),
        (NODE % "weight: [1]", "line 3, pool.nodes[0].weight: must be a single value."),
        (NODE % "threads: [1]", "line 3, pool.nodes[0].threads: must be a single value."),
    ],
)
def test_each_mistake_is_named_with_its_line_and_field(text, error) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert str(caught.value).startswith(error), str(caught.value)


def test_a_file_over_a_mebibyte_is_refused_unread() -> None:
    parse_config("#" * (MAX_BYTES - 1) + "\n")  # at the limit
    with pytest.raises(ConfigError) as caught:
        parse_config("#" * MAX_BYTES + "\n")
    assert str(caught.value) == f"the file is larger than {MAX_BYTES} bytes."
    assert (caught.value.line, caught.value.field) == (None, None)
