"""When a stored package file may go: only when no version refers to it and nobody holds it.

Every path that stores a file (an import, an upload, a build, a template change) registers
it inside ``unless_registered``: the writer's shared hold on the sha256 (``store.Hold``) lasts
until its row is committed, and on failure the file is removed only if no row refers to it and
no other writer or reader holds it (``PackageStore.remove_unused``). ``package_delete`` and
the garbage sweep of job clean-up use the same test (``file_unused``), so no failure path or
delete can take a file that another writer is about to register or another version holds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction

from inference.models import ModelPackage
from inference.packages.store import PackageStore, Stored

log = logging.getLogger(__name__)


def sha256_in_use(sha256: str) -> bool:
    """True when a package row refers to the file with this sha256."""
    return ModelPackage.objects.filter(sha256=sha256).exists()


def file_unused(store: PackageStore, sha256: str) -> bool:
    """Remove ``sha256``'s stored file if no row refers to it and nobody holds it; returns
    whether it was removed."""
    return store.remove_unused(sha256, sha256_in_use)


@contextmanager
def unless_registered(stored: Stored, store: PackageStore) -> Iterator[Stored]:
    """``stored`` (held), for the block that registers it. When the block ends the hold is
    released: on success once the registration is committed (``transaction.on_commit`` inside
    an atomic block, at once outside one); on failure at once, and the file is then removed
    if no version refers to it and no other writer or reader holds it."""
    try:
        yield stored
    except BaseException:
        stored.release()
        try:
            file_unused(store, stored.sha256)
        except Exception:  # the database cannot say: keep the file (the sweep decides later)
            log.warning("kept %s: could not tell whether it is used", stored.path, exc_info=True)
        raise
    if connection.in_atomic_block:
        transaction.on_commit(stored.release)
    else:
        stored.release()
