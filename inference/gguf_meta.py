"""What a GGUF file says of itself, read with the ``gguf`` package's ``GGUFReader``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GgufInfo:
    """Architecture (``llama``), quantization type (``Q4_1``), context window (tokens), chat
    template (Jinja text, may be empty)."""

    architecture: str
    quantization: str
    context_window: int
    chat_template: str


DEFAULT = GgufInfo(architecture="", quantization="", context_window=2048, chat_template="")


def _value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    part = field.parts[field.data[0]]
    if field.types and field.types[0].name == "STRING":
        return bytes(part).decode("utf-8", "replace")
    return part.tolist()[0] if hasattr(part, "tolist") else part


def read_gguf_info(path: Path) -> GgufInfo:
    """Read the metadata of ``path``; falls back to ``DEFAULT`` fields when a key is missing or
    the file cannot be parsed (never raises for a readable file)."""
    try:
        import gguf

        reader = gguf.GGUFReader(str(path), "r")
        arch = _value(reader, "general.architecture") or ""
        file_type = _value(reader, "general.file_type")
        try:
            quant = (
                gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
                if file_type is not None
                else ""
            )
        except ValueError:
            quant = str(file_type)
        context = _value(reader, f"{arch}.context_length") if arch else None
        template = _value(reader, "tokenizer.chat_template") or ""
    except Exception:  # a damaged or unexpected file still registers, with defaults
        return DEFAULT
    return GgufInfo(
        architecture=str(arch),
        quantization=quant,
        context_window=int(context) if context else DEFAULT.context_window,
        chat_template=str(template),
    )
