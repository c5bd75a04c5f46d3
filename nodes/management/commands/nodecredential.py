"""``manage.py nodecredential --id <node>``: the credential this control plane presents to a node.

Give it to a remote node agent (``$PHALANX_NODE_CREDENTIAL`` or ``runnode --credential-file``)
or to an external server (``llama-server --api-key``). ``--proof-key`` adds the node's proof
key after it, the line a node agent's credential file takes (``<credential> <proof key>``), so
it proves itself on every call. A node that joined with a join token needs neither: it received
both. See docs/node-protocol.md.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from nodes.credentials import array_id, credential_for, node_keys, proof_key_for


class Command(BaseCommand):
    help = "Print the credential the control plane presents to a node."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--id", required=True, help="node id, e.g. node-07")
        parser.add_argument(
            "--secret",
            default=None,
            help="derive from this node secret instead of the array's (for a rotation)",
        )
        parser.add_argument(
            "--proof-key",
            action="store_true",
            help="print the node's proof key after the credential (a credential file's line)",
        )

    def handle(self, *args, **options) -> None:
        node_id, secret = options["id"], options["secret"]
        keys = node_keys(node_id)
        if secret:
            credential = credential_for(secret, node_id, keys.epoch)
            proof_key = proof_key_for(secret, node_id, keys.epoch)
        else:
            credential, proof_key = keys.credential, keys.proof_key
        self.stdout.write(f"{credential} {proof_key}" if options["proof_key"] else credential)
        self.stderr.write(f"array id (runnode --array-id): {array_id(secret)}")
