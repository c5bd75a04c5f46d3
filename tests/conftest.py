"""Suite-wide hooks: each test starts with empty hot-path caches and ends with every routing
record written (the proxy writes routes off the request path, ``inference.route_writer``)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_lookups() -> None:
    from inference import lookups

    lookups.clear()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Before the test's fixtures (and its database) are torn down."""
    from inference.route_writer import route_writer

    route_writer.flush()
