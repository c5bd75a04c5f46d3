"""Suite-wide hooks: each test starts with empty hot-path caches (and no request failures
remembered) and ends with every routing
record written (the proxy writes routes off the request path, ``inference.route_writer``; rate-limit
counts are written behind, ``inference.usage.limit_store_memory``)."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

import pytest

# One node secret for this run: node agents the tests start and every control plane they start
# (in this process or as children, under any PHALANX_HOME) derive the same node credentials.
os.environ.setdefault("PHALANX_NODE_SECRET", f"tests-{secrets.token_hex(8)}")
# Node agents the tests start keep no shared prefixes on disk (a prefix one test's node saved
# would warm another test's first turn); a test of warm starts gives its node a shelf.
os.environ.setdefault("PHALANX_PREFIX_DIR", "")
# Node agents the tests start are repeatable (runnode --repeatable): the tests compare the text
# of a turn whose prefix came from the KV cache with a fresh one's. The speed default (flash
# attention timed at load) has tests of its own (tests/inference/engine/test_tuning.py).
os.environ.setdefault("PHALANX_REPEATABLE", "1")
# `manage.py up` in the tests serves the bundled file as it is: the chain that builds, gates and
# rolls out the fastest type here (inference.packages.serving_default) has tests of its own.
os.environ.setdefault("PHALANX_SERVING_TYPE", "bundled")
# Engines and nodes the tests start keep their decode-fill history (where their decode ran,
# which the next start's timing of the KV settings follows) in a file of this run's, not in
# the machine's ~/.cache/phalanx/decode-fill.json that a real node on this machine reads.
os.environ.setdefault(
    "PHALANX_DECODE_FILL_FILE", str(Path(tempfile.mkdtemp(prefix="phalanx-tests-")) / "fill.json")
)


@pytest.fixture(autouse=True)
def _fresh_lookups() -> None:
    from inference import lookups
    from inference.relay import broken_turns
    from inference.request_breaker import request_breaker
    from inference.usage import priority

    lookups.clear()
    request_breaker.clear()
    broken_turns.clear()
    # a process's priority gate, as a new process has it: each test has its own event loop,
    # and a turn a test left open on a closed loop can never end
    priority.gate.__init__()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Before the test's fixtures (and its database) are torn down."""
    from inference.route_writer import route_writer
    from inference.usage import limits
    from inference.usage.recorder import recorder

    route_writer.flush()
    recorder.flush()
    limits.forget_counts()  # the next test's process counts afresh
