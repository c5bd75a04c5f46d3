"""The base of Phalanx's management commands that read or write the array's database.

A command run against a database that was never migrated (``manage.py loadtest`` before the
first ``make run``) would stop deep inside a query with ``no such table``; ``ArrayCommand``
checks first and says what to run instead, and ships the command's log records
(``console.lib.log_shipping``). Commands that need no database (``runnode``) or that
migrate it themselves (``up``) stay plain ``BaseCommand``s.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor

from console.lib.log_shipping import ship_from_here, to_database

FIRST_RUN = (
    "run `make run` once (it migrates, registers the bundled model and starts the array), "
    "or `.venv/bin/python manage.py migrate` for the database alone"
)


def database_unmigrated(alias: str = DEFAULT_DB_ALIAS) -> str | None:
    """None when every migration is applied to database ``alias``; else a sentence naming the
    database and how many migrations it lacks."""
    connection = connections[alias]
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if not plan:
        return None
    name = connection.settings_dict.get("NAME")
    never = not executor.loader.applied_migrations
    state = "was never migrated" if never else f"lacks {len(plan)} migration(s)"
    return f"The database {name} {state}: {FIRST_RUN} first."


class ArrayCommand(BaseCommand):
    """``BaseCommand`` that refuses to start, with a ``CommandError`` saying what to run, when
    the database is not migrated; run as the process's main command, it ships the process's
    log records to the database (``console.lib.log_shipping``)."""

    def execute(self, *args: Any, **options: Any) -> Any:
        problem = database_unmigrated()
        if problem is not None:
            raise CommandError(problem)
        ship_from_here(self.__module__.rpartition(".")[2], to_database())
        return super().execute(*args, **options)
