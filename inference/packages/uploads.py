"""Uploads in parts: a GGUF sent over HTTP as parts of at most ``part_bytes`` each.

Why parts: daphne reads a whole request body and queues it to the application before any of
our code runs, so a single-request upload of a multi-GiB GGUF would sit in the control
plane's memory, sent by anyone before they are authenticated. A part is an ordinary request
body, bounded like every other by ``MAX_REQUEST_BODY_BYTES`` (8 MiB; ``console/lib/body_limit.py``),
so memory per request stays bounded and each part is authenticated before it is written.

The protocol (``inference/packages/api.py``; the page's upload uses it, as does any client):

1. ``upload_begin`` (name, version, size, sha256) -> an upload id and the part size;
2. ``upload_append`` (offset, bytes), repeated: a part is written at the end of what arrived;
   an offset that is not the end is a 409 naming the right one, so a client resumes after an
   interruption by asking (``upload_get``) and sending from there;
3. ``upload_finish``: the file is hashed, checked against the announced sha256, moved into
   the store (a rename) and imported as a draft version.

State lives in the store's ``incoming/uploads/<id>/`` (``meta.json`` and ``data.part``), so an
upload survives a control-plane restart. Uploads with no part for ``STALE_AFTER_S`` are
removed (``uploads_collect_stale``, from the control loop).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings

from console.lib.errors import Conflict, ConsoleError, Invalid, NotFound
from inference.models import ModelPackage
from inference.packages import services
from inference.packages.intake import GGUF_MAGIC, package_store
from inference.packages.naming import check_name
from inference.packages.registry import BadFile
from inference.packages.retention import unless_registered
from inference.packages.services import Imported

STALE_AFTER_S = 24 * 3600
UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
SHA256 = re.compile(r"[0-9a-f]{64}")


class InsufficientStorage(ConsoleError):
    """The store's disk has less room than the upload announces (507)."""

    status = 507
    code = "insufficient_storage"


@dataclass
class Upload:
    """One upload: what it will import as, its size and sha256 as announced (bytes, hex),
    and ``received`` (bytes written so far: the offset of the next part)."""

    id: str
    name: str
    version: str
    size: int
    sha256: str
    filename: str
    received: int = 0
    started_at: float = 0.0

    @property
    def complete(self) -> bool:
        return self.received == self.size


def part_bytes() -> int:
    """The largest part a request may carry: the request body limit."""
    return int(settings.MAX_REQUEST_BODY_BYTES)


def _root() -> Path:
    return package_store().root / "incoming" / "uploads"


def _dir(upload_id: str) -> Path:
    if not UPLOAD_ID.fullmatch(upload_id or ""):
        raise NotFound(f"No upload {upload_id!r}.", code="upload_not_found")
    path = _root() / upload_id
    if not (path / "meta.json").is_file():
        raise NotFound(
            f"No upload {upload_id} (finished, discarded or expired).", code="upload_not_found"
        )
    return path


def _read(path: Path) -> Upload:
    upload = Upload(**json.loads((path / "meta.json").read_text()))
    data = path / "data.part"
    upload.received = data.stat().st_size if data.exists() else 0
    return upload


@contextmanager
def _locked(upload_id: str) -> Iterator[Path]:
    """The upload's directory, held against other requests for the same upload."""
    path = _dir(upload_id)
    gone = NotFound(f"No upload {upload_id} (finished or discarded).", code="upload_not_found")
    try:
        handle = open(path / "meta.json", "rb")  # noqa: SIM115 (held for the lock's life)
    except FileNotFoundError as exc:  # finished or discarded a moment ago
        raise gone from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if not (path / "meta.json").is_file():  # finished while we waited
                raise gone
            yield path
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def upload_begin(
    *, name: str, version: str | None = None, size: int, sha256: str = "", filename: str = ""
) -> Upload:
    """Start an upload of ``size`` bytes to import as ``name:version`` (the next version at
    finish when omitted). Raises ``Invalid`` (bad name, size 0 or over ``PACKAGE_UPLOAD_MAX_BYTES``, a
    sha256 that is not 64 hex digits), ``Conflict`` (``name:version`` exists with another
    file), ``InsufficientStorage`` (the disk has less room than ``size`` beside the uploads under
    way)."""
    check_name(name, version or "1")
    sha256 = sha256.strip().lower()
    if sha256 and not SHA256.fullmatch(sha256):
        raise Invalid("sha256: 64 hexadecimal digits.", field="sha256")
    limit = int(settings.PACKAGE_UPLOAD_MAX_BYTES)
    if size < 1 or size > limit:
        raise Invalid(
            f"size: between 1 and {limit:,} bytes; this upload is {size:,}.", field="size"
        )
    existing = ModelPackage.objects.filter(name=name, version=version).first() if version else None
    if existing is not None and sha256 and existing.sha256 != sha256:
        raise Conflict(
            f"{existing.key} exists; a different file is a new version.",
            code="package_conflict",
            field="version",
        )
    root = _root()
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free - _promised()
    if free < size:
        raise InsufficientStorage(
            f"the package store has {max(0, free):,} bytes free beside the uploads under way; "
            f"this one needs {size:,}."
        )
    upload = Upload(
        id=secrets.token_hex(16),
        name=name,
        version=version or "",
        size=size,
        sha256=sha256,
        filename=Path(filename).name[:255],
        started_at=time.time(),
    )
    path = root / upload.id
    path.mkdir()
    (path / "data.part").touch()
    (path / "meta.json").write_text(
        json.dumps({k: v for k, v in asdict(upload).items() if k != "received"})
    )
    return upload


def upload_get(*, upload_id: str) -> Upload:
    """The upload and how much of it arrived. Raises ``NotFound``."""
    return _read(_dir(upload_id))


def upload_append(*, upload_id: str, offset: int, data: bytes) -> Upload:
    """Write ``data`` at ``offset``, which must be what arrived so far. Raises ``NotFound``,
    ``Conflict`` (``upload_offset``: another offset; the message names the right one),
    ``Invalid`` (empty part, over ``part_bytes()``, past the announced size), ``BadFile``
    (the first part does not start with ``GGUF``: the upload is discarded)."""
    with _locked(upload_id) as path:
        upload = _read(path)
        if offset != upload.received:
            raise Conflict(
                f"offset: this upload has {upload.received:,} bytes; send the part that starts "
                "there.",
                code="upload_offset",
                field="offset",
            )
        if not data:
            raise Invalid("body: a part carries at least one byte.", field="body")
        if len(data) > part_bytes():
            raise Invalid(f"body: a part is at most {part_bytes():,} bytes.", field="body")
        if offset + len(data) > upload.size:
            raise Invalid(
                f"body: the part ends at byte {offset + len(data):,}, past the announced size "
                f"of {upload.size:,}.",
                field="body",
            )
        if offset == 0 and data[:4] != GGUF_MAGIC:
            shutil.rmtree(path, ignore_errors=True)
            raise BadFile(
                f"{upload.filename or 'the upload'} is not a GGUF file: it starts with "
                f"{data[:4]!r}, a GGUF file starts with {GGUF_MAGIC!r}."
            )
        try:
            with open(path / "data.part", "ab") as out:
                out.write(data)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            os.truncate(path / "data.part", offset)  # the part is all or nothing
            raise InsufficientStorage(
                "the package store's disk is full; free space and send this part again."
            ) from exc
        upload.received += len(data)
        return upload


def upload_finish(*, upload_id: str) -> Imported:
    """Check and import a complete upload; the upload is gone afterwards whatever the
    outcome, except when bytes are missing. Raises ``NotFound``, ``Conflict``
    (``upload_incomplete``: the message says how many bytes arrived; or the version exists),
    ``BadFile`` (the sha256 differs from the announced one: nothing is kept)."""
    with _locked(upload_id) as path:
        upload = _read(path)
        if not upload.complete:
            raise Conflict(
                f"{upload.received:,} of {upload.size:,} bytes arrived; send the rest first.",
                code="upload_incomplete",
            )
        try:
            return _import(upload, path / "data.part")
        finally:
            shutil.rmtree(path, ignore_errors=True)


def _import(upload: Upload, data: Path) -> Imported:
    store = package_store()
    with unless_registered(store.adopt(data), store) as stored:
        if upload.sha256 and upload.sha256 != stored.sha256:
            raise BadFile(
                f"the upload's sha256 is {stored.sha256}, not the {upload.sha256} it was "
                "announced with: the file changed on the way."
            )
        return services.package_import_file(
            path=stored.path,
            name=upload.name,
            version=upload.version or None,  # none given: the next one, now
            source={"kind": "import", "from": f"upload {upload.filename or '(unnamed)'}"},
        )


def _promised() -> int:
    """Bytes the uploads under way have announced and not yet sent."""
    total = 0
    for path in _root().glob("*/meta.json"):
        try:
            upload = _read(path.parent)
        except (OSError, ValueError, TypeError):
            continue
        total += max(0, upload.size - upload.received)
    return total


def upload_discard(*, upload_id: str) -> None:
    """Drop an upload and what arrived of it. Raises ``NotFound``."""
    with _locked(upload_id) as path:
        shutil.rmtree(path, ignore_errors=True)


def uploads_collect_stale(*, older_than_s: float = STALE_AFTER_S) -> list[str]:
    """Remove uploads with no part for ``older_than_s`` seconds; returns their ids."""
    removed = []
    root = _root()
    if not root.is_dir():
        return removed
    cutoff = time.time() - older_than_s
    for path in root.iterdir():
        data = path / "data.part"
        try:
            last = data.stat().st_mtime if data.exists() else path.stat().st_mtime
        except OSError:
            continue
        if last < cutoff:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed
