"""``manage.py upgrade start|list|show|pause|resume|promote|abort``: rolling upgrades from a
shell (the same services as the REST API and the Upgrades page). The control loop runs them
(``manage.py up`` starts one); ``start --wait`` follows the upgrade to its end, printing its
events, and ``--drive`` steps it in this process instead, for an array without a control
loop. The last line is one JSON object."""

from __future__ import annotations

import json
import time

from django.core.management.base import CommandError

from console.lib.audit import acting_as
from console.lib.commands import ArrayCommand
from console.lib.errors import ConsoleError
from inference.management.commands.package import _package
from inference.models import Upgrade
from inference.upgrades import driver, services
from inference.upgrades.api import upgrade_out

SETTING_FLAGS = ("max_unavailable", "canary_share", "bake_s", "drain_timeout_s", "switch_timeout_s")


class Command(ArrayCommand):
    help = "Start, follow and steer rolling upgrades."

    def add_arguments(self, parser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        start = sub.add_parser("start", help="plan an upgrade FROM -> TO (id or name:version)")
        start.add_argument("from_package")
        start.add_argument("to_package")
        start.add_argument("--model", default=None, help="the name clients ask for")
        for flag in SETTING_FLAGS:
            start.add_argument(f"--{flag.replace('_', '-')}", type=float, default=None)
        start.add_argument(
            "--no-traffic",
            choices=("pause", "proceed"),
            default=None,
            help="when a bake compares nothing (too little traffic, after waiting another "
            "bake time): pause (the default) or proceed",
        )
        start.add_argument(
            "--node-setting",
            action="append",
            default=[],
            metavar="KEY=N",
            help="threads, sequences, ctx_per_seq or host_ram_mib to roll with it",
        )
        start.add_argument("--wait", action="store_true", help="follow it to its end")
        start.add_argument("--drive", action="store_true", help="step it here (no control loop)")
        sub.add_parser("list", help="recent upgrades")
        for name in ("show", "pause", "resume", "promote", "abort"):
            p = sub.add_parser(name)
            p.add_argument("upgrade_id", type=int)
            if name == "abort":
                p.add_argument("--reason", default="")

    def handle(self, *args, **o) -> None:
        try:
            with acting_as("cli"):
                out = getattr(self, f"_{o['action']}")(o)
        except ConsoleError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(json.dumps(out, default=str))

    def _start(self, o) -> dict:
        settings = {k: o[k] for k in SETTING_FLAGS if o[k] is not None}
        if "max_unavailable" in settings:
            settings["max_unavailable"] = int(settings["max_unavailable"])
        if o["no_traffic"]:
            settings["no_traffic"] = o["no_traffic"]
        upgrade = services.upgrade_start(
            from_package_id=_package(o["from_package"]).pk,
            to_package_id=_package(o["to_package"]).pk,
            model=o["model"],
            settings=settings,
            node_settings=_node_settings(o["node_setting"]),
        )
        self.stderr.write(f"upgrade {upgrade.pk} planned: {upgrade.events.first().message}")
        if o["wait"] or o["drive"]:
            upgrade = self._follow(upgrade.pk, drive=o["drive"])
        return upgrade_out(services.upgrade_get(upgrade.pk))

    def _follow(self, upgrade_id: int, *, drive: bool) -> Upgrade:
        seen = 0
        while True:
            if drive:
                driver.upgrades_tick()
            upgrade = services.upgrade_get(upgrade_id)
            for event in upgrade.events.all()[seen:]:
                where = f" {event.node_id}" if event.node_id else ""
                self.stderr.write(f"{event.at:%H:%M:%S}{where} {event.kind}: {event.message}")
                seen += 1
            if upgrade.finished:
                return upgrade
            time.sleep(1.0)

    def _list(self, o) -> list:
        return [
            upgrade_out(u)
            for u in Upgrade.objects.select_related("from_package", "to_package")[:20]
        ]

    def _show(self, o) -> dict:
        return upgrade_out(services.upgrade_get(o["upgrade_id"]))

    def _pause(self, o) -> dict:
        return upgrade_out(services.upgrade_pause(upgrade_id=o["upgrade_id"]))

    def _resume(self, o) -> dict:
        return upgrade_out(services.upgrade_resume(upgrade_id=o["upgrade_id"]))

    def _promote(self, o) -> dict:
        return upgrade_out(services.upgrade_promote(upgrade_id=o["upgrade_id"]))

    def _abort(self, o) -> dict:
        return upgrade_out(services.upgrade_abort(upgrade_id=o["upgrade_id"], reason=o["reason"]))


def _node_settings(pairs: list[str]) -> dict[str, int]:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if not value.isdigit():
            raise CommandError(f"--node-setting {pair!r}: KEY=N with N a whole number")
        out[key.strip()] = int(value)
    return out
