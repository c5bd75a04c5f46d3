"""A fresh database on the machine's PostgreSQL for tests of the scale-out mode
(``.ci/run`` starts the server), dropped after."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PG = "postgresql://postgres@127.0.0.1:5432"
REDIS = "redis://127.0.0.1:6379/0"


@contextmanager
def fresh_database(prefix: str = "phalanx") -> Iterator[str]:
    """Yields the ``DATABASE_URL`` of a new, empty database; fails the test (never skips) when
    the machine's PostgreSQL does not answer."""
    import psycopg  # the scale extra, which make test installs

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(f"{PG}/postgres", autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"no PostgreSQL at {PG} ({exc}): .ci/run starts the machine's own")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{PG}/{name}"
        finally:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def redis_url() -> str:
    """The machine's Redis (``.ci/run`` starts it); fails the test when it does not answer."""
    import redis

    try:
        redis.Redis.from_url(REDIS, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.fail(f"no Redis at {REDIS} ({exc}): .ci/run starts the machine's own")
    return REDIS
