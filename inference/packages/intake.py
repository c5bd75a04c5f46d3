"""A source GGUF into the package store: the store under ``PHALANX_HOME/packages``, the source
opened (an operator's path re-checked on the open file), its magic checked before a byte is
copied, and the bytes stored as they are or with a chat template written into a copy in
scratch space.

Errors: ``BadFile`` (cannot be read, not a GGUF), from ``inference.packages.registry``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from django.conf import settings

from inference.models import ModelPackage
from inference.packages.import_paths import ImportPath, open_import, readable_path
from inference.packages.registry import BadFile
from inference.packages.store import PackageStore, Stored

GGUF_MAGIC = b"GGUF"


def package_store() -> PackageStore:
    """The store under ``PHALANX_HOME/packages``."""
    return PackageStore(Path(settings.VAR_DIR) / "packages")


def open_source(path: Path) -> BinaryIO:
    """``path`` opened for reading: through ``open_import`` when it is an operator's path."""
    if isinstance(path, ImportPath):
        return open_import(path)
    try:
        return open(path, "rb")  # noqa: SIM115 (the caller closes it)
    except OSError as exc:
        raise BadFile(f"{Path(path).name} cannot be read: {exc.strerror or exc}.") from exc


def store_source(
    store: PackageStore,
    path: Path,
    handle: BinaryIO,
    chat_template: str | None,
    workdir: Path | None,
) -> tuple[Stored, str]:
    """The source in the store (held), with ``chat_template`` written in when given."""
    if chat_template is None or not chat_template.strip():
        if store.holds(path) and not isinstance(path, ImportPath):
            return _stored_already(store, path), ModelPackage.TemplateSource.GGUF
        return store.add_file(handle), ModelPackage.TemplateSource.GGUF
    with scratch_space(workdir) as scratch:
        readable = Path(path) if not isinstance(path, ImportPath) else readable_path(handle)
        if readable is None:  # no /proc: read the open file into scratch first
            readable = scratch / "source.gguf"
            with open(readable, "wb") as out:
                shutil.copyfileobj(handle, out, 1 << 20)
        templated = with_template(readable, chat_template, scratch)
        return store.add_file(templated), ModelPackage.TemplateSource.OPERATOR


def _stored_already(store: PackageStore, path: Path) -> Stored:
    try:
        return store.stored(path)
    except ValueError as exc:
        raise BadFile(str(exc)) from exc


def check_magic(handle: BinaryIO, path: Path) -> None:
    """Raise ``BadFile`` unless ``handle`` starts like a GGUF (before copying a byte of it);
    it is left at its start. The message does not quote the file's bytes: the path may name
    any file on the host."""
    try:
        first = handle.read(4)
        handle.seek(0)
    except OSError as exc:
        raise BadFile(f"{Path(path).name} cannot be read: {exc.strerror or exc}.") from exc
    if first != GGUF_MAGIC:
        raise BadFile(
            f"{Path(path).name} is not a GGUF file (a GGUF file starts with {GGUF_MAGIC!r})."
        )


@contextmanager
def scratch_space(workdir: Path | None) -> Iterator[Path]:
    """``workdir`` when given (a job's, removed by the job), else a fresh directory of its
    own under the store's ``work/``, removed afterwards."""
    if workdir is not None:
        yield workdir
        return
    root = package_store().root / "work"
    root.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="scratch-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def with_template(path: Path, template: str, scratch: Path) -> Path:
    """A copy of the GGUF at ``path`` in ``scratch`` whose ``tokenizer.chat_template`` is
    ``template``. Raises ``BadFile`` when ``path`` is not a readable GGUF."""
    from inference.packages.gguf_files import NotGguf, write_with_chat_template

    target = scratch / "with-template.gguf"
    try:
        write_with_chat_template(path, target, template)
    except NotGguf as exc:
        raise BadFile(str(exc)) from exc
    return target
