"""The content-addressed package store: every GGUF file under ``<home>/packages/sha256/``.

A file is named by its sha256 (``sha256/ab/abcdef....gguf``), written once (to a temporary
name in the store, then renamed, so a reader never sees half a file) and made read-only. Two
versions with the same bytes share one file. Job scratch space is ``work/job-<id>/``, removed
when the job ends.

Who may remove a stored file: nobody while anything may still use it. Each sha256 has a lock
file (``locks/ab/abcdef....lock``, ``fcntl.flock``). A writer takes it shared before it looks
whether the file is there and keeps it until its package row is committed (``Stored.hold``);
a reader that must not lose a file meanwhile does the same (``hold``). Removal
(``remove_unused``) takes it exclusive without waiting, so it happens only when no writer or
reader holds it, and then only if the caller's ``in_use(sha256)`` (a package row refers to it)
says no. A failure path therefore never deletes a file another writer is about to register or
another version holds; a file that could not be removed because someone held it is either
registered by that holder or removed by it when it fails in turn (or, if both failed at the
same moment, swept by ``collect_garbage``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20


class Hold:
    """A shared lock on one sha256 (an open lock file); ``release()`` ends it (idempotent).
    While it is held, ``remove_unused`` of that sha256 does nothing."""

    def __init__(self, fd: int, sha256: str) -> None:
        self.fd: int | None = fd
        self.sha256 = sha256

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor of the open file drops its flock

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # a hold nobody released (an abandoned transaction) ends too
        self.release()


@dataclass(frozen=True)
class Stored:
    """A file in the store: its sha256 (hex), path and size (bytes); ``hold``, the shared lock
    the writer keeps until its package row is committed (``release()``)."""

    sha256: str
    path: Path
    size_bytes: int
    created: bool = False  # this call wrote it (it was not there before)
    hold: Hold | None = field(default=None, compare=False, repr=False)

    def release(self) -> None:
        if self.hold is not None:
            self.hold.release()


class PackageStore:
    """The store rooted at ``root`` (``PHALANX_HOME/packages``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path_for(self, sha256: str) -> Path:
        """Where the file with this sha256 lives (whether or not it is there)."""
        return self.root / "sha256" / sha256[:2] / f"{sha256}.gguf"

    def _lock_path(self, sha256: str) -> Path:
        return self.root / "locks" / sha256[:2] / f"{sha256}.lock"

    def work_dir(self, name: str) -> Path:
        """A fresh scratch directory ``work/<name>`` (emptied if it existed)."""
        path = self.root / "work" / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def discard_work(self, name: str) -> None:
        shutil.rmtree(self.root / "work" / name, ignore_errors=True)

    def _lock(self, sha256: str, *, exclusive: bool) -> int | None:
        """An open lock file of ``sha256`` locked shared (waits) or exclusive (does not wait:
        None when anyone holds it). The lock file is removed with its stored file, so a lock
        taken on a file that was unlinked meanwhile is dropped and taken again on the new one."""
        path = self._lock_path(sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX | fcntl.LOCK_NB) if exclusive else fcntl.LOCK_SH)
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                current = False
            if current:
                return fd
            os.close(fd)

    def hold(self, sha256: str) -> Hold:
        """A shared hold on ``sha256`` (waits while a removal of it is under way): the stored
        file, if there, stays until the hold is released."""
        fd = self._lock(sha256, exclusive=False)
        assert fd is not None
        return Hold(fd, sha256)

    def remove_unused(self, sha256: str, in_use: Callable[[str], bool]) -> bool:
        """Remove the stored file of ``sha256`` when nobody holds it and ``in_use(sha256)`` is
        false (asked under the exclusive lock). Returns whether it was removed."""
        fd = self._lock(sha256, exclusive=True)
        if fd is None:
            return False
        try:
            if in_use(sha256):
                return False
            path = self.path_for(sha256)
            removed = path.exists()
            path.unlink(missing_ok=True)
            self._lock_path(sha256).unlink(missing_ok=True)
            return removed
        finally:
            os.close(fd)

    def add_file(
        self, src: Path | BinaryIO, *, progress: Callable[[float], None] | None = None
    ) -> Stored:
        """Copy ``src`` (a path, or a file opened for binary reading) into the store (a
        source outside it is never moved); returns where it is, held (``Stored.hold``: the
        caller releases it). The sha256 is computed from the bytes copied, so what the store
        holds is what was hashed. Raises ``OSError`` when ``src`` cannot be read; nothing is
        left behind on any error."""
        incoming = self.root / "incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=incoming, suffix=".part")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                if isinstance(src, Path | str):
                    with open(src, "rb") as handle:
                        digest, written = _copy(handle, out, progress)
                else:
                    digest, written = _copy(src, out, progress)
            return self._settle(tmp, digest, written)
        finally:
            tmp.unlink(missing_ok=True)

    def adopt(self, path: Path) -> Stored:
        """Move ``path`` (a file under this store's root, e.g. a finished upload) into the
        store by its sha256: hashed where it lies, then renamed (no copy), held as
        ``add_file``'s result is. The file is gone from ``path`` afterwards."""
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
        size = path.stat().st_size
        try:
            return self._settle(path, digest.hexdigest(), size)
        finally:
            path.unlink(missing_ok=True)

    def _settle(self, tmp: Path, sha256: str, size: int) -> Stored:
        """Put ``tmp`` in place as ``sha256``'s file unless it is there, under a shared hold
        taken before looking (a removal cannot come between the look and the registration)."""
        hold = self.hold(sha256)
        try:
            final = self.path_for(sha256)
            created = not final.exists()
            if created:
                final.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(tmp, 0o444)
                os.replace(tmp, final)
            os.utime(final)  # young again: the garbage sweep spares it until it is registered
        except BaseException:
            hold.release()
            raise
        return Stored(sha256=sha256, path=final, size_bytes=size, created=created, hold=hold)

    def collect_garbage(
        self, in_use: Callable[[str], bool], *, older_than_s: float = 3600
    ) -> list[Path]:
        """Remove stored files no package refers to (``in_use(sha256)`` false) and that no
        writer or reader holds, and partial writes; both only when untouched for
        ``older_than_s`` seconds (a partial write has no hold; a process of an older release
        may not take one). Returns what was removed. Failed and cancelled jobs clean up their
        own outputs (``retention.unless_registered``); this sweeps what a killed process left."""
        cutoff = time.time() - older_than_s
        removed = []
        for path in sorted((self.root / "sha256").glob("*/*.gguf")):
            try:
                old = path.stat().st_mtime < cutoff
            except OSError:
                continue
            if old and not in_use(path.stem) and self.remove_unused(path.stem, in_use):
                removed.append(path)
        self._sweep_locks()
        for path in sorted((self.root / "incoming").glob("*.part")):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)
                    removed.append(path)
            except OSError:
                continue
        return removed

    def _sweep_locks(self) -> None:
        """Remove lock files whose stored file is gone and that nobody holds (a holder that
        waited on one notices it was unlinked and locks the new one)."""
        for lock in (self.root / "locks").glob("*/*.lock"):
            if self.path_for(lock.stem).exists():
                continue
            fd = self._lock(lock.stem, exclusive=True)
            if fd is None:
                continue
            try:
                if not self.path_for(lock.stem).exists():
                    lock.unlink(missing_ok=True)
            finally:
                os.close(fd)

    def stored(self, path: Path) -> Stored:
        """A file already in the store (named by its sha256), by its canonical path, held as
        ``add_file``'s result is. Raises ``ValueError`` for a path that is not where its name
        says it belongs, or whose file is gone."""
        sha256 = Path(path).stem
        canonical = self.path_for(sha256)
        if canonical.resolve() != Path(path).resolve():
            raise ValueError(f"{path} is not a file of the package store")
        hold = self.hold(sha256)
        if not canonical.is_file():
            hold.release()
            raise ValueError(f"{path} is not a file of the package store")
        size = canonical.stat().st_size
        return Stored(sha256=sha256, path=canonical, size_bytes=size, hold=hold)

    def holds(self, path: str | Path) -> bool:
        """True when ``path`` is a file of this store."""
        try:
            return Path(path).resolve().is_relative_to((self.root / "sha256").resolve())
        except OSError:
            return False


def _copy(
    src: BinaryIO, out: BinaryIO, progress: Callable[[float], None] | None
) -> tuple[str, int]:
    """Copy ``src`` to ``out`` from where ``src`` is; returns (sha256 hex, bytes)."""
    size = os.fstat(src.fileno()).st_size
    digest = hashlib.sha256()
    written = 0
    while chunk := src.read(CHUNK):
        written += len(chunk)
        digest.update(chunk)
        out.write(chunk)
        if progress and size:
            progress(min(1.0, written / size))
    return digest.hexdigest(), written
