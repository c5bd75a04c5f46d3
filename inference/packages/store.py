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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20


@dataclass(frozen=True)
class Stored:
    """A file in the store: its sha256 (hex), path and size (bytes)."""

    sha256: str
    path: Path
    size_bytes: int


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
        what was hashed. Raises ``OSError`` when ``src`` cannot be read."""
        size = src.stat().st_size
        with open(src, "rb") as handle:
            return self.add_stream(_chunks(handle), size_hint=size, progress=progress)

    def add_stream(
        self,
        chunks: Iterable[bytes],
        *,
        size_hint: int | None = None,
        max_bytes: int | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> Stored:
        """Write ``chunks`` into the store, hashing as they arrive (never all in memory).
        Raises ``TooLarge`` past ``max_bytes``; nothing is left behind on any error."""
        incoming = self.root / "incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        written = 0
        fd, tmp_name = tempfile.mkstemp(dir=incoming, suffix=".part")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    written += len(chunk)
                    if max_bytes is not None and written > max_bytes:
                        raise TooLarge(f"the file is over the limit of {max_bytes:,} bytes")
                    digest.update(chunk)
                    out.write(chunk)
                    if progress and size_hint:
                        progress(min(1.0, written / size_hint))
            return self._settle(tmp, digest.hexdigest(), written)
        finally:
            tmp.unlink(missing_ok=True)

    def _settle(self, tmp: Path, sha256: str, size: int) -> Stored:
        final = self.path_for(sha256)
        if not final.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp, 0o444)
            os.replace(tmp, final)
        return Stored(sha256=sha256, path=final, size_bytes=size)

    def collect_garbage(self, referenced: set[str]) -> list[Path]:
        """Remove stored files no package refers to (``referenced``: their paths) and stale
        partial writes; returns what was removed. Cancelled or failed jobs call it, so a job
        killed between storing its file and registering it leaves nothing behind."""
        keep = {str(Path(p).resolve()) for p in referenced}
        removed = []
        for path in sorted((self.root / "sha256").glob("*/*.gguf")):
            if str(path.resolve()) not in keep:
                path.unlink(missing_ok=True)
                removed.append(path)
        for path in (self.root / "incoming").glob("*.part"):
            path.unlink(missing_ok=True)
            removed.append(path)
        return removed

    def stored(self, path: Path) -> Stored:
        """A file already in the store (named by its sha256)."""
        return Stored(sha256=Path(path).stem, path=Path(path), size_bytes=Path(path).stat().st_size)

    def holds(self, path: str | Path) -> bool:
        """True when ``path`` is a file of this store."""
        try:
            return Path(path).resolve().is_relative_to((self.root / "sha256").resolve())
        except OSError:
            return False


class TooLarge(ValueError):
    """An upload over the size limit."""


def _chunks(handle) -> Iterable[bytes]:
    while chunk := handle.read(CHUNK):
        yield chunk
