"""Files on the control plane's host that an operator names for import (``path``).

With ``PHALANX_IMPORT_DIRS`` set, only files under those directories may be imported. The
rule is checked twice: when the import is asked for (``check_import_path``: a 422 at once)
and again when the file is opened (``open_import``), because a path checked when a job is
queued may lead elsewhere by the time it runs (a symlink swapped, a directory renamed). The
second check is on the file actually opened: it is opened first, then the opened file's own
path (``/proc/self/fd/N`` on Linux; elsewhere its device and inode against the path resolved
again) must be under an allowed directory, and it must be a regular file. Everything the import
reads afterwards comes from that open file, never from the path again.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PosixPath
from typing import BinaryIO

from django.conf import settings

from console.lib.errors import Invalid

_PROC_FD = Path("/proc/self/fd")
PATH_MAX = 4096  # Linux's limit on a whole path, in bytes


class ImportPath(PosixPath):
    """A path ``check_import_path`` accepted: ``package_import_file`` opens it with
    ``open_import`` (checked again on the open file)."""


def _allowed() -> list[Path]:
    return [Path(d).resolve() for d in settings.PACKAGE_IMPORT_DIRS]


def _refuse_outside(resolved: Path, allowed: list[Path]) -> None:
    if allowed and not any(resolved.is_relative_to(d) for d in allowed):
        raise Invalid(
            f"path: imports are allowed from {', '.join(map(str, allowed))} only "
            "(PHALANX_IMPORT_DIRS).",
            field="path",
        )


def check_import_path(path: str) -> ImportPath:
    """``path`` resolved, as a file this host may import from. Raises ``Invalid`` (422,
    ``field="path"``) when the path is over ``PATH_MAX`` or holds a NUL, cannot be resolved,
    has no file there, or when ``PHALANX_IMPORT_DIRS`` is set and
    the file is in none of them."""
    if len(path) > PATH_MAX or "\0" in path:
        raise Invalid(
            f"path: at most {PATH_MAX:,} characters, with no NUL; this one has {len(path):,}.",
            field="path",
        )
    try:
        resolved = Path(path).resolve()
        _refuse_outside(resolved, _allowed())
        found = resolved.is_file()
    except OSError as exc:  # a component too long, a loop of links
        raise Invalid(
            f"path: {_shown(path)} cannot be used: {exc.strerror}.", field="path"
        ) from exc
    if not found:
        raise Invalid(f"path: no file at {_shown(path)}.", field="path")
    return ImportPath(resolved)


def _shown(path: str) -> str:
    return path if len(path) <= 200 else f"{path[:200]}…"


def open_import(path: str | Path) -> BinaryIO:
    """Open ``path`` for reading after checking it again, and check what was opened: the
    returned file is the one that passed. Raises ``Invalid`` (422, ``field="path"``) as
    ``check_import_path`` does, when the file cannot be opened, is not a regular file, or
    was swapped for one outside the allowed directories between the check and the open."""
    resolved = check_import_path(str(path))
    try:
        fd = os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Invalid(f"path: cannot open {path}: {exc.strerror}.", field="path") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Invalid(f"path: {path} is not a regular file.", field="path")
        _refuse_outside(_opened_path(fd, resolved, path), _allowed())
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _opened_path(fd: int, resolved: Path, path: str | Path) -> Path:
    """Where the open file ``fd`` really is."""
    if _PROC_FD.is_dir():
        return Path(os.readlink(_PROC_FD / str(fd)))
    try:  # no /proc: the path, resolved again now, must still be the file that is open
        again = Path(path).resolve()
        same = again == resolved and os.path.samestat(os.fstat(fd), os.stat(again))
    except OSError:
        same = False
    if not same:
        raise Invalid(f"path: {path} changed while it was opened.", field="path")
    return resolved


def readable_path(handle: BinaryIO) -> Path | None:
    """A path that reads the open file ``handle`` itself (``/proc/self/fd/N``), or None
    where the system has none."""
    return _PROC_FD / str(handle.fileno()) if _PROC_FD.is_dir() else None
