"""``manage.py exportconfig [-o FILE]``: the inventory and settings as a YAML config file."""

from __future__ import annotations

from console.config_file import export_config
from console.lib.commands import ArrayCommand


class Command(ArrayCommand):
    help = "Export the inventory and settings as a YAML config file."

    def add_arguments(self, parser) -> None:
        parser.add_argument("-o", "--output", help="write here instead of standard output")

    def handle(self, *args, **options) -> None:
        text = export_config()
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8") as handle:
                handle.write(text)
        else:
            self.stdout.write(text, ending="")
