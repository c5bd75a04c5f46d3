"""``manage.py package`` where its input enters: a database that was never migrated says what
to run first instead of a no-such-table traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.processes import REPO


def test_a_database_never_migrated_says_what_to_run_first(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PHALANX_SQLITE", "DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, "manage.py", "package", "list"],
        cwd=REPO,
        env={**env, "PHALANX_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "was never migrated: run `make run` once" in done.stderr
    assert "Traceback" not in done.stderr
