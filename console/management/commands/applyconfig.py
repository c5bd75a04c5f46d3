"""``manage.py applyconfig FILE [--prune] [--dry-run]``: apply a config file (see
``console.config_file``); ``-`` reads standard input. Exits 1 naming line and field on error."""

from __future__ import annotations

import getpass
import sys

from django.core.management.base import CommandError

from console.config_file import ConfigError, apply_config_text
from console.lib.audit import set_actor
from console.lib.commands import ArrayCommand
from console.lib.errors import ConsoleError


class Command(ArrayCommand):
    help = "Apply a YAML config file to the inventory (idempotent)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("file", help="YAML file, or - for standard input")
        parser.add_argument("--prune", action="store_true", help="remove nodes not in the file")
        parser.add_argument("--dry-run", action="store_true", help="only show what would change")

    def handle(self, *args, **options) -> None:
        set_actor(f"cli:{getpass.getuser()}")  # the audit log says who applied it
        path = options["file"]
        try:
            text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror}") from exc
        try:
            report = apply_config_text(text, prune=options["prune"], dry_run=options["dry_run"])
        except (ConfigError, ConsoleError) as exc:
            raise CommandError(f"{path}: {exc}") from exc
        prefix = "would be " if report.dry_run else ""
        for label in ("created", "updated", "unchanged", "removed"):
            ids = getattr(report, label)
            if ids:
                self.stdout.write(
                    f"{prefix if label != 'unchanged' else ''}{label}: {', '.join(ids)}"
                )
        if report.settings_changed:
            self.stdout.write(f"{prefix}changed settings: {', '.join(report.settings_changed)}")
        for change in report.changes:
            self.stdout.write(f"  {change}")
        for warning in report.warnings:
            self.stderr.write(f"warning: {warning}")
        if not report.changed:
            self.stdout.write("nothing to change")
