"""Config as a file: apply a YAML description of the array to the inventory, export it back.

The shape (every section and key optional; a node needs ``id`` and ``address``)::

    server: {listen: 127.0.0.1:9391, routing_key_header: X-Session-Id}
    pool:
      nodes:
        - {id: node-01, address: 127.0.0.11:9391, weight: 10, affinity: true}
      health_check_interval_ms: 5000
      failover_strategy: stick_and_redirect
    inference:
      model_path: /opt/models/agent-q4_k_m.gguf
      ai_module: device0,device1
      context_window: 4096
      max_batch: 32
    quotas:
      roles: {viewer: {requests_per_minute: 30, tokens_per_day: 200000}}
      tokens: {ci-agent: {requests_per_minute: 60, priority: 7}}

Where it goes: ``server.routing_key_header``, ``pool.health_check_interval_ms`` and
``pool.failover_strategy`` → ``inference.RoutingPolicy``; ``pool.nodes`` → ``nodes.Node`` (also
``cpu_set``, ``threads``, ``max_sessions``, ``kv_budget_tokens``, ``package``, and ``kind:
external`` with ``served_name`` for an external OpenAI-compatible server, optional); the rest → ``console.ArrayConfig``. ``model_path`` names
the package every listed node serves: the newest package with that ``gguf_path``, else the file
is registered as a package when it exists on this host, else nodes keep theirs (a warning).
``quotas`` → ``inference.usage.quotas.quota_set``: each role's default and each token's quota
(``Quota.LIMITS``, a whole number or null for blank), a token by its name (the one not revoked
with it: an unknown or shared name is an error naming it); export writes every role's and each
token with a quota, except names several tokens share (a comment says which).

Applying is idempotent (a second apply changes nothing and reports every node unchanged) and
``export_config(apply_config(parse_config(text)))`` gives the same document back. Nodes not in the
file are kept unless ``prune=True``. Every error is a ``ConfigError`` naming the line and field:
``line 5, pool.nodes[1].address: must be host:port, for example 127.0.0.1:9401``.
"""

from __future__ import annotations

from console.config_file.apply import apply_config, apply_config_text
from console.config_file.export import export_config, export_document
from console.config_file.parse import parse_config
from console.config_file.spec import ApplyReport, ArraySpec, ConfigError, NodeSpec

__all__ = [
    "ApplyReport",
    "ArraySpec",
    "ConfigError",
    "NodeSpec",
    "apply_config",
    "apply_config_text",
    "export_config",
    "export_document",
    "parse_config",
]
