"""The content-addressed package store: every GGUF file under ``<home>/packages/sha256/``.

A file is named by its sha256 (``sha256/ab/abcdef....gguf``), written once (to a temporary
name in the store, then renamed, so a reader never sees half a file) and made read-only. Two
versions with the same bytes share one file. Job scratch space is ``work/job-<id>/``, removed
when the job ends.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20


@dataclass(frozen=True)
class Stored:
    """A file in the store: its sha256 (hex), path and size (bytes)."""

    sha256: str
    path: Path
    size_bytes: int
    created: bool = False  # this call wrote it (not there before): only its writer removes it


class PackageStore:
    """The store rooted at ``root`` (``PHALANX_HOME/packages``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path_for(self, sha256: str) -> Path:
        """Where the file with this sha256 lives (whether or not it is there)."""
        return self.root / "sha256" / sha256[:2] / f"{sha256}.gguf"

    def work_dir(self, name: str) -> Path:
        """A fresh scratch directory ``work/<name>`` (emptied if it existed)."""
        path = self.root / "work" / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def discard_work(self, name: str) -> None:
        shutil.rmtree(self.root / "work" / name, ignore_errors=True)

    def add_file(self, src: Path, *, progress: Callable[[float], None] | None = None) -> Stored:
        """Copy ``src`` into the store (a source outside it is never moved); returns
        where it is. The sha256 is computed from the bytes copied, so what the store holds is
        what was hashed. Raises ``OSError`` when ``src`` cannot be read; nothing is left
        behind on any error."""
        size = src.stat().st_size
        incoming = self.root / "incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        written = 0
        fd, tmp_name = tempfile.mkstemp(dir=incoming, suffix=".part")
        tmp = Path(tmp_name)
        try:
            with open(src, "rb") as handle, os.fdopen(fd, "wb") as out:
                while chunk := handle.read(CHUNK):
                    written += len(chunk)
                    digest.update(chunk)
                    out.write(chunk)
                    if progress and size:
                        progress(min(1.0, written / size))
            return self._settle(tmp, digest.hexdigest(), written)
        finally:
            tmp.unlink(missing_ok=True)

    def adopt(self, path: Path) -> Stored:
        """Move ``path`` (a file under this store's root, e.g. a finished upload) into the
        store by its sha256: hashed where it lies, then renamed (no copy). The file is gone
        from ``path`` afterwards."""
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
        final = self.path_for(sha256)
        created = not final.exists()
        if created:
            final.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp, 0o444)
            os.replace(tmp, final)
        os.utime(final)  # young again: the garbage sweep spares it until it is registered
        return Stored(sha256=sha256, path=final, size_bytes=size, created=created)

    def collect_garbage(self, referenced: set[str], *, older_than_s: float = 3600) -> list[Path]:
        """Remove stored files no package refers to (``referenced``: their paths) and
        partial writes, both only when untouched for ``older_than_s`` seconds: a file another
        process is writing, or has stored and is about to register, is younger than that.
        Returns what was removed. Failed and cancelled jobs clean up their own outputs
        (``services.unless_registered``); this sweeps what a killed process left."""
        keep = {str(Path(p).resolve()) for p in referenced}
        cutoff = time.time() - older_than_s
        removed = []
        candidates = [
            *[p for p in (self.root / "sha256").glob("*/*.gguf") if str(p.resolve()) not in keep],
            *(self.root / "incoming").glob("*.part"),
        ]
        for path in sorted(candidates):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)
                    removed.append(path)
            except OSError:
                continue
        return removed

    def stored(self, path: Path) -> Stored:
        """A file already in the store (named by its sha256), by its canonical path.
        Raises ``ValueError`` for a path that is not where its name says it belongs."""
        sha256 = Path(path).stem
        canonical = self.path_for(sha256)
        if canonical.resolve() != Path(path).resolve() or not canonical.is_file():
            raise ValueError(f"{path} is not a file of the package store")
        return Stored(sha256=sha256, path=canonical, size_bytes=canonical.stat().st_size)

    def holds(self, path: str | Path) -> bool:
        """True when ``path`` is a file of this store."""
        try:
            return Path(path).resolve().is_relative_to((self.root / "sha256").resolve())
        except OSError:
            return False
