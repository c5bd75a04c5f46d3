"""``manage.py bootstrap --nodes N``: the embedded array's inventory (see ``console.embedded``)."""

from __future__ import annotations

import os

from django.core.management.base import CommandError

from console.embedded import ADMIN_USER, NODE_BASE_PORT, BootstrapResult, array_bootstrap
from console.lib.commands import ArrayCommand
from inference.tokens import ENV_TOKEN


def describe(result: BootstrapResult) -> list[str]:
    """Lines for the operator: package, nodes, login, token."""
    lines = [
        f"package {result.package.key} ({result.package.quantization}, "
        f"ctx {result.package.context_window}) at {result.model_path}"
    ]
    lines += [f"node {n.node_id} at {n.address}, cpus {n.cpu_set}" for n in result.nodes]
    if result.admin_password:
        lines.append(f"admin login: {ADMIN_USER} / {result.admin_password}")
    else:
        lines.append(
            f"admin login: {ADMIN_USER} (password set earlier; "
            f"change it with: manage.py changepassword {ADMIN_USER})"
        )
    if result.api_token:
        lines.append(f"API token: {result.api_token}")
    elif os.environ.get(ENV_TOKEN):
        lines.append(f"API token: ${ENV_TOKEN} is in use")
    return lines


class Command(ArrayCommand):
    help = (
        "Fetch and register the bundled model, register N local nodes, the admin user and a token."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--nodes", type=int, default=2)
        parser.add_argument(
            "--node-port",
            type=int,
            default=NODE_BASE_PORT,
            help="port of node-01; node-N gets +N-1",
        )

    def handle(self, *args, **options) -> None:
        try:
            result = array_bootstrap(nodes=options["nodes"], node_base_port=options["node_port"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        for line in describe(result):
            self.stdout.write(line)
