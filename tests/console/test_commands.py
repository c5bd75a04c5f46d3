"""Management commands run against a database that was never migrated say what to run first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

COMMANDS = [
    ["package", "list"],
    ["loadtest", "ramp-quick"],
    ["upgrade", "list"],
    ["validate", "node-01"],
    ["exportconfig"],
    ["controlloop", "--once"],
]


def _run(home: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PHALANX_SQLITE")}
    env["PHALANX_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_it_says_what_to_run_first_on_a_database_never_migrated(tmp_path, args):
    done = _run(tmp_path, args)
    assert done.returncode == 1
    database = tmp_path / "phalanx.sqlite3"
    assert done.stderr.strip().splitlines()[-1] == (
        f"CommandError: The database {database} was never migrated: run `make run` once (it "
        "migrates, registers the bundled model and starts the array), or "
        "`.venv/bin/python manage.py migrate` for the database alone first."
    )
    assert "Traceback" not in done.stderr and "no such table" not in done.stderr
