"""File-level operations on GGUF files, with the ``gguf`` package's reader and writer.

``read_facts`` says what a file is (architecture, parameters, quantization, tensor mix, chat
template); ``write_with_chat_template`` and ``dequantize_to_f16`` write a changed copy. A copy
is made the way ``gguf/scripts/gguf_new_metadata.py`` (in the same package) makes one: every
metadata field but the writer's own, then the tensor infos, then the tensor data, one tensor
at a time; strings go through as bytes, so text the reader cannot decode is kept as it was.
Every write lands atomically (a temporary file beside the target, then a rename).

Format reference: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

MAGIC = b"GGUF"
CHAT_TEMPLATE = gguf.Keys.Tokenizer.CHAT_TEMPLATE  # "tokenizer.chat_template"
FILE_TYPE = gguf.Keys.General.FILE_TYPE  # "general.file_type"
# tensor types a file of plain floats holds (dequantize_to_f16 copies these as they are)
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})

_T = gguf.GGMLQuantizationType
_V = gguf.GGUFValueType


class NotGguf(ValueError):
    """The file is not a GGUF file, is truncated or damaged, or cannot be read; the message
    says which (``not a GGUF file: it starts with b'PK\\x03\\x04', ...``)."""


@dataclass(frozen=True)
class GgufFacts:
    """What a GGUF file says of itself.

    ``size_bytes``: the file's size. ``architecture``: ``general.architecture`` (``llama``).
    ``name``: ``general.name`` ("" when absent). ``parameters``: the sum of all tensors'
    element counts. ``quantization``: the file type, ``Q4_1``, ``Q4_K_M``, ``F16``, ``F32``
    (``general.file_type`` read as ``gguf.LlamaFileType``; when that key is absent, the most
    common type among the tensors of two or more dimensions). ``context_length``: the training
    context in tokens (``<arch>.context_length``), None when absent. ``chat_template``: the
    Jinja text of ``tokenizer.chat_template``, "" when absent; ``chat_template_sha256``: the
    hex sha256 of its UTF-8 bytes, "" when absent. ``tensor_types``: ggml type name -> number
    of tensors (``{"Q4_1": 211, "F32": 61, "Q6_K": 1}``). ``bos_token`` / ``eos_token``: the
    text of those tokens, "" when the file names none.
    """

    size_bytes: int
    architecture: str
    name: str
    parameters: int
    quantization: str
    context_length: int | None
    chat_template: str
    chat_template_sha256: str
    tensor_count: int
    tensor_types: dict[str, int]
    bos_token: str = ""
    eos_token: str = ""


def open_gguf(path: Path | str) -> gguf.GGUFReader:
    """A ``GGUFReader`` over ``path`` (memory-mapped, read-only).

    Raises ``NotGguf`` when the file cannot be read, does not start with ``b"GGUF"`` (checked
    on its first 4 bytes before anything else is parsed), is truncated or damaged, or declares
    more metadata keys, array entries or tensors than the reader parses (``MAX_*``)."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
            size = os.fstat(handle.fileno()).st_size
    except OSError as error:
        raise NotGguf(f"cannot read {path}: {error.strerror}") from error
    if head != MAGIC:
        if len(head) < len(MAGIC):
            raise NotGguf(f"not a GGUF file: it has {size} bytes, a GGUF starts with {MAGIC!r}")
        raise NotGguf(f"not a GGUF file: it starts with {head!r}, a GGUF starts with {MAGIC!r}")
    try:
        reader = _Reader(path, "r")
    except _PastEnd as error:
        raise NotGguf(_truncated(size, error.end)) from error
    except _OverBounds as error:
        raise NotGguf(f"GGUF not read ({size:,} bytes): {error}") from error
    except Exception as error:  # the reader is a parser of outside data: any failure is the file's
        raise NotGguf(f"damaged GGUF ({size} bytes): {error}") from error
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=reader.data_offset)
    if end > size:
        raise NotGguf(_truncated(size, end))
    return reader


def read_facts(path: Path | str) -> GgufFacts:
    """The facts of the GGUF file at ``path`` (reads the header and tensor infos only, but
    ``GGUFReader`` parses every vocabulary entry as it goes: about 3 s for SmolLM2's 49k
    tokens and 49k merges on two busy cores, more for larger vocabularies).

    Raises ``NotGguf`` (see ``open_gguf``)."""
    reader = open_gguf(path)
    arch = _text(reader, gguf.Keys.General.ARCHITECTURE)
    template = _raw_text(reader, CHAT_TEMPLATE)
    context = _scalar(reader, f"{arch}.context_length")
    return GgufFacts(
        size_bytes=Path(path).stat().st_size,
        architecture=arch,
        name=_text(reader, gguf.Keys.General.NAME),
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        quantization=_quantization(reader),
        context_length=int(context) if context is not None else None,
        chat_template=template.decode("utf-8", "replace") if template is not None else "",
        chat_template_sha256=hashlib.sha256(template).hexdigest() if template is not None else "",
        tensor_count=len(reader.tensors),
        tensor_types=dict(Counter(t.tensor_type.name for t in reader.tensors).most_common()),
        bos_token=_token_text(reader, gguf.Keys.Tokenizer.BOS_ID),
        eos_token=_token_text(reader, gguf.Keys.Tokenizer.EOS_ID),
    )


def write_with_chat_template(src: Path | str, dst: Path | str, template: str | None) -> None:
    """Write ``dst``: a copy of ``src`` whose ``tokenizer.chat_template`` is ``template``
    (None removes the key), every other field and every tensor as they were. Named templates
    (``tokenizer.chat_template.tool_use``) are kept as they are. ``dst`` may be ``src``.

    Raises ``NotGguf`` for a ``src`` that is not a readable GGUF; ``dst`` is then untouched."""
    reader = open_gguf(src)
    if template is None:
        changes: dict[str, tuple[Any, gguf.GGUFValueType] | None] = {CHAT_TEMPLATE: None}
    else:
        changes = {CHAT_TEMPLATE: (template.encode("utf-8"), _V.STRING)}
    with atomic_path(dst, mode_from=src) as part:
        _write_copy(reader, part, changes, convert={})


def dequantize_to_f16(
    src: Path | str, dst: Path | str, progress: Callable[[float], None] | None = None
) -> None:
    """Write ``dst``: ``src`` with every quantized tensor dequantized
    (``gguf.quants.dequantize``) and stored as F16, or as F32 when it has one dimension;
    F32 / F16 tensors are copied, BF16 ones become F16. The metadata is copied, with
    ``general.file_type`` set to ``MOSTLY_F16``. ``progress(fraction)`` (0..1, by elements
    written) is called after each tensor.

    Raises ``NotGguf`` for a ``src`` that is not a readable GGUF, ``NotImplementedError`` for
    a tensor type the ``gguf`` package cannot dequantize, ``ValueError`` when a value does not
    fit in F16 (beyond +-65504); ``dst`` is untouched then."""
    reader = open_gguf(src)
    convert = {
        t.name: (_T.F16 if len(t.shape) >= 2 else _T.F32)
        for t in reader.tensors
        if t.tensor_type == _T.BF16 or is_quantized(t.tensor_type.name)
    }
    changes = {FILE_TYPE: (int(gguf.LlamaFileType.MOSTLY_F16), _V.UINT32)}
    with atomic_path(dst, mode_from=src) as part:
        _write_copy(reader, part, changes, convert=convert, progress=progress)


def is_quantized(type_name: str) -> bool:
    """Whether a ggml type name (``Q4_K``, ``IQ4_NL``, ``F32``, ``I32``) is a type of quantized
    blocks, not a float or integer type."""
    return type_name not in FLOAT_TYPES and (
        not type_name.startswith("I") or type_name.startswith("IQ")
    )


@contextmanager
def atomic_path(dst: Path | str, *, mode_from: Path | str | None = None) -> Iterator[Path]:
    """A temporary path beside ``dst`` to write to; when the block ends without an exception
    the file is flushed to disk and renamed to ``dst`` (replacing it), otherwise removed.
    ``mode_from``: a file whose permission bits the new file takes (else 0600)."""
    dst = Path(dst)
    fd, name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent)
    os.close(fd)
    part = Path(name)
    try:
        yield part
        with open(part, "rb+") as handle:
            os.fsync(handle.fileno())
        if mode_from is not None:
            shutil.copymode(mode_from, part)
        os.replace(part, dst)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


# --- reading ---------------------------------------------------------------------------------


def _bound(what: str, count: int, limit: int) -> None:
    if count > limit:
        raise _OverBounds(f"it declares {count:,} {what}, over the limit of {limit:,}")


class _PastEnd(Exception):
    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


# What the reader parses, at most. It builds Python objects per metadata entry and per array
# element, so a header that declares billions of them costs memory and minutes before anything
# else can be said. A 262k-token vocabulary (Gemma 3) with its scores and types is ~0.8M array
# entries; the largest models have a few thousand tensors.
MAX_METADATA_KEYS = 1 << 16
MAX_ARRAY_ENTRIES = 1 << 24  # all metadata arrays together
MAX_TENSORS = 1 << 20


class _OverBounds(Exception):
    """The header declares more than the reader parses (the message says what and the limit)."""


class _Reader(gguf.GGUFReader):
    """``GGUFReader`` that says when the file ends before what it reads: every read of the
    reader goes through ``_get``, which otherwise returns a short array that fails later with
    a numpy message about shapes; and that refuses, before parsing them, more metadata keys,
    array entries or tensors than ``MAX_METADATA_KEYS``, ``MAX_ARRAY_ENTRIES``,
    ``MAX_TENSORS``."""

    _entries = 0

    def _build_fields(self, offs: int, count: int) -> int:
        _bound("metadata keys", int(count), MAX_METADATA_KEYS)
        return super()._build_fields(offs, count)

    def _build_tensor_info(self, offs: int, count: int) -> Any:
        _bound("tensors", int(count), MAX_TENSORS)
        return super()._build_tensor_info(offs, count)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
        if raw_type == _V.ARRAY:  # item type (uint32), then the entry count (uint64)
            self._entries += int(self._get(orig_offs + 4, np.uint64)[0])
            _bound("metadata array entries", self._entries, MAX_ARRAY_ENTRIES)
        return super()._get_field_parts(orig_offs, raw_type)

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > self.data.shape[0]:
            raise _PastEnd(end)
        return super()._get(offset, dtype, count, override_order)


def _truncated(size: int, end: int) -> str:
    if end > 1 << 48:  # no file is that long: a count or length in the header is garbage
        return f"damaged GGUF ({size:,} bytes): a length in it runs to byte {end:,}"
    return f"truncated GGUF: it has {size:,} bytes, its contents need at least {end:,}"


def _scalar(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    if field is None or not field.types or field.types[0] in (_V.ARRAY, _V.STRING):
        return None
    return field.contents()


def _raw_text(reader: gguf.GGUFReader, key: str) -> bytes | None:
    field = reader.get_field(key)
    if field is None or field.types[:1] != [_V.STRING]:
        return None
    return bytes(field.parts[-1])


def _text(reader: gguf.GGUFReader, key: str) -> str:
    raw = _raw_text(reader, key)
    return raw.decode("utf-8", "replace") if raw is not None else ""


def _token_text(reader: gguf.GGUFReader, id_key: str) -> str:
    token_id = _scalar(reader, id_key)
    tokens = reader.get_field(gguf.Keys.Tokenizer.LIST)
    if token_id is None or tokens is None or not 0 <= token_id < len(tokens.data):
        return ""
    return bytes(tokens.parts[tokens.data[token_id]]).decode("utf-8", "replace")


def _quantization(reader: gguf.GGUFReader) -> str:
    value = _scalar(reader, FILE_TYPE)
    if value is not None and value != gguf.LlamaFileType.GUESSED:
        try:
            name = gguf.LlamaFileType(int(value)).name
        except ValueError:  # a type newer than this gguf package
            return str(value)
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    weights = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2)
    return weights.most_common(1)[0][0] if weights else ""


def _field_value(field: Any) -> Any:
    """A field's value as ``GGUFWriter.add_key_value`` takes it; strings as their raw bytes."""
    main = field.types[0]
    if main == _V.STRING:
        return bytes(field.parts[-1])
    if main == _V.ARRAY and field.types[-1] == _V.STRING:
        return [bytes(field.parts[i]) for i in field.data]
    return field.contents()


# --- writing a copy ---------------------------------------------------------------------------


def _write_copy(
    reader: gguf.GGUFReader,
    dst: Path,
    changes: dict[str, tuple[Any, gguf.GGUFValueType] | None],
    *,
    convert: dict[str, gguf.GGMLQuantizationType],
    progress: Callable[[float], None] | None = None,
) -> None:
    """Write ``reader``'s file to ``dst`` with the metadata ``changes`` (key -> (value, type),
    or None to drop the key; a changed key keeps its place, a new one comes last) and the
    tensors named in ``convert`` dequantized to the given float type (F16 / F32)."""
    arch = _text(reader, gguf.Keys.General.ARCHITECTURE)
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    alignment = _scalar(reader, gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment
    _add_metadata(reader, writer, changes)
    _add_tensor_infos(reader, writer, convert)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    try:
        _write_tensor_data(reader, writer, convert, progress)
    finally:
        writer.close()


def _add_metadata(
    reader: gguf.GGUFReader,
    writer: gguf.GGUFWriter,
    changes: dict[str, tuple[Any, gguf.GGUFValueType] | None],
) -> None:
    """``reader``'s metadata on ``writer``, with ``changes`` applied (see ``_write_copy``)."""
    pending = dict(changes)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # the writer writes these itself
        if field.name in pending:
            change = pending.pop(field.name)
            if change is not None:
                writer.add_key_value(field.name, change[0], change[1])
            continue
        sub_type = field.types[-1] if field.types[0] == _V.ARRAY else None
        writer.add_key_value(field.name, _field_value(field), field.types[0], sub_type=sub_type)
    for key, change in pending.items():
        if change is not None:
            writer.add_key_value(key, change[0], change[1])


def _add_tensor_infos(
    reader: gguf.GGUFReader,
    writer: gguf.GGUFWriter,
    convert: dict[str, gguf.GGMLQuantizationType],
) -> None:
    """The tensor table on ``writer``: each tensor as it is, or in its ``convert`` type."""
    for tensor in reader.tensors:
        out_type = convert.get(tensor.name)
        if out_type is None:
            data = tensor.data
            writer.add_tensor_info(
                tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type
            )
        else:
            dtype = np.dtype(np.float16 if out_type == _T.F16 else np.float32)
            shape = tuple(int(d) for d in reversed(tensor.shape))
            nbytes = int(tensor.n_elements) * dtype.itemsize
            writer.add_tensor_info(tensor.name, shape, dtype, nbytes, out_type)


def _write_tensor_data(
    reader: gguf.GGUFReader,
    writer: gguf.GGUFWriter,
    convert: dict[str, gguf.GGMLQuantizationType],
    progress: Callable[[float], None] | None,
) -> None:
    """Each tensor's data to ``writer``, dequantized when ``convert`` names it;
    ``progress(fraction)`` after each, by elements written."""
    total = sum(int(t.n_elements) for t in reader.tensors) or 1
    done = 0
    for tensor in reader.tensors:
        out_type = convert.get(tensor.name)
        if out_type is None:
            writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
        else:
            writer.write_tensor_data(_dequantized(tensor, out_type))
        done += int(tensor.n_elements)
        if progress is not None:
            progress(done / total)


def _dequantized(tensor: Any, out_type: gguf.GGMLQuantizationType) -> np.ndarray:
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    if out_type == _T.F32:
        return values.astype(np.float32, copy=False)
    with np.errstate(over="ignore"):
        halves = values.astype(np.float16)
    if not np.isfinite(halves).all() and np.isfinite(values).all():
        raise ValueError(f"{tensor.name}: values beyond F16's range (+-65504)")
    return halves
