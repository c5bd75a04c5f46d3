"""``manage.py nodecredential --id <node>``: the credential this control plane presents to a node.

Give it to a remote node agent (``$PHALANX_NODE_CREDENTIAL`` or ``runnode --credential-file``)
or to an external server (``llama-server --api-key``). See docs/node-protocol.md.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from nodes.credentials import array_id, credential_for, node_credential


class Command(BaseCommand):
    help = "Print the credential the control plane presents to a node."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--id", required=True, help="node id, e.g. node-07")
        parser.add_argument(
            "--secret",
            default=None,
            help="derive from this node secret instead of the array's (for a rotation)",
        )

    def handle(self, *args, **options) -> None:
        node_id = options["id"]
        secret = options["secret"]
        self.stdout.write(credential_for(secret, node_id) if secret else node_credential(node_id))
        self.stderr.write(f"array id (runnode --array-id): {array_id(secret)}")
