"""Reads of the package store that need care: what a stored GGUF file says of itself, as the
package pages and ``GET /api/packages/<id>`` show it (cached per path, mtime and size)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from inference.packages.gguf_files import read_facts

if TYPE_CHECKING:
    from inference.models import ModelPackage


@dataclass(frozen=True)
class GgufOnDisk:
    """What a GGUF file says of itself: architecture, parameter count (sum of tensor sizes),
    quantization type, context length (tokens), chat template, tensor count, file size (bytes).
    ``error`` is set (and the rest empty) when the file is missing or unreadable here."""

    exists: bool
    size_bytes: int | None = None
    architecture: str = ""
    parameters: int | None = None
    quantization: str = ""
    context_length: int | None = None
    chat_template: str = ""
    tensors: int | None = None
    name: str = ""
    error: str = ""

    @property
    def parameters_human(self) -> str:
        """``135M``, ``1.7B`` ..."""
        return count_human(self.parameters)


def count_human(count: int | None) -> str:
    """``134515008`` -> ``135M``, ``1.7e9`` -> ``1.7B``; None or 0 -> ``—``."""
    if not count:
        return "—"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.3g}{unit}"
    return str(count)


@lru_cache(maxsize=64)
def _facts(path: str, mtime: float, size: int) -> GgufOnDisk:
    try:
        facts = read_facts(path)
    except Exception as exc:  # a damaged file still says what is wrong with it
        return GgufOnDisk(exists=True, size_bytes=size, error=f"cannot read it: {exc}"[:200])
    return GgufOnDisk(
        exists=True,
        size_bytes=size,
        architecture=facts.architecture,
        parameters=facts.parameters,
        quantization=facts.quantization,
        context_length=facts.context_length,
        chat_template=facts.chat_template,
        tensors=facts.tensor_count,
        name=facts.name,
    )


def package_facts(package: ModelPackage) -> GgufOnDisk:
    """``gguf_facts`` of a chat package's file; for an embedding package (a directory of model
    files, no GGUF) what the row says, with ``exists`` for the directory."""
    if package.kind != package.Kind.EMBEDDING:
        return gguf_facts(package.gguf_path)
    found = os.path.isdir(package.gguf_path)
    return GgufOnDisk(
        exists=found,
        size_bytes=package.size_bytes,
        architecture=package.architecture,
        parameters=package.parameters,
        quantization=package.quantization,
        context_length=package.context_window,
        tensors=sum((package.tensor_types or {}).values()) or None,
        name=package.name,
        error="" if found else "the files directory is not on this host",
    )


def gguf_facts(path: str) -> GgufOnDisk:
    """Facts of the GGUF file at ``path`` on this host (cached per path, mtime and size)."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        return GgufOnDisk(exists=False, error=f"not on this host: {exc.strerror}")
    return _facts(path, stat.st_mtime, stat.st_size)
