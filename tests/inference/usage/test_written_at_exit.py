"""What a control-plane process counted in its last half second is written when it stops: the
usage turns (``recorder``) and the embedded array's rate-limit counts (``limit_store_memory``)
are written behind, and a process that exits right after counting still writes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from inference.models import RateWindow, UsageTurn

pytestmark = pytest.mark.django_db(transaction=True)

COUNT_AND_EXIT = """
import django
django.setup()
from inference.usage import limits
from inference.usage.quotas import Caller, Limits
from inference.usage.recorder import Turn, recorder
recorder.record(Turn(caller="token:7", caller_name="agent", model="m", completion_tokens=5))
admission = limits.admit(Caller("token:7", "agent", "operator", Limits(requests_per_minute=9)))
"""


def test_a_process_that_exits_at_once_still_writes_its_usage_and_rate_counts():
    database = connection.settings_dict["NAME"]
    assert connection.vendor == "sqlite" and Path(database).exists()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-c", COUNT_AND_EXIT],
        env={**env, "PHALANX_SQLITE": database, "DJANGO_SETTINGS_MODULE": "console.settings"},
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert list(UsageTurn.objects.values_list("caller", "completion_tokens")) == [("token:7", 5)]
    assert [(k.split(":")[2], n) for k, n in RateWindow.objects.values_list("key", "count")] == [
        ("rpm", 1)
    ]
