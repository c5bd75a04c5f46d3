"""GGUF files as a package build sees them: their facts, a new chat template, an F16 copy."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from inference.packages.gguf_files import (
    NotGguf,
    dequantize_to_f16,
    read_facts,
    write_with_chat_template,
)
from tests.support.processes import bundled_model_path

pytestmark = pytest.mark.model

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"


@pytest.fixture(scope="module")
def model() -> Path:
    return bundled_model_path()


@pytest.fixture(scope="module")
def model_tensors(model) -> dict[str, tuple[str, tuple[int, ...], str]]:
    return tensors(model)


def tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """name -> (type, shape, sha256 of the data) of every tensor of a GGUF file."""
    reader = gguf.GGUFReader(path)
    return {
        t.name: (
            t.tensor_type.name,
            tuple(int(d) for d in t.shape),
            hashlib.sha256(t.data.tobytes()).hexdigest(),
        )
        for t in reader.tensors
    }


def fields(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items()}


def test_it_reads_the_facts_of_the_bundled_model(model):
    facts = read_facts(model)

    assert facts.architecture == "llama"
    assert facts.quantization == "Q4_1"
    assert 130_000_000 < facts.parameters < 140_000_000
    assert facts.tensor_count == 272
    assert facts.tensor_types == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert facts.context_length == 8192
    assert facts.size_bytes == model.stat().st_size
    assert "<|im_start|>" in facts.chat_template
    assert facts.chat_template_sha256 == hashlib.sha256(facts.chat_template.encode()).hexdigest()
    assert (facts.bos_token, facts.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_it_names_the_magic_of_a_file_that_is_not_gguf(tmp_path):
    archive = tmp_path / "model.gguf"
    archive.write_bytes(b"PK\x03\x04" + bytes(100))

    with pytest.raises(NotGguf) as raised:
        read_facts(archive)

    assert str(raised.value) == (
        "not a GGUF file: it starts with b'PK\\x03\\x04', a GGUF starts with b'GGUF'"
    )


def test_it_says_how_short_a_file_too_short_for_the_magic_is(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")

    with pytest.raises(NotGguf, match=r"^not a GGUF file: it has 0 bytes, a GGUF starts with"):
        read_facts(empty)


def test_it_calls_a_cut_off_download_truncated(model, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(model, "rb") as whole:
        cut.write_bytes(whole.read(50_000_000))

    with pytest.raises(NotGguf) as raised:
        read_facts(cut)

    assert str(raised.value).startswith(
        "truncated GGUF: it has 50,000,000 bytes, its contents need at least "
    )


def small_gguf(path: Path, *, keys: int = 0, entries: int = 0) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    for i in range(keys):
        writer.add_uint32(f"test.key{i}", i)
    if entries:
        writer.add_array("test.entries", list(range(entries)))
    writer.add_tensor("w", np.ones((2, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("bound", "kw", "what"),
    [
        ("MAX_ARRAY_ENTRIES", {"entries": 11}, "11 metadata array entries, over the limit of 10"),
        ("MAX_METADATA_KEYS", {"keys": 11}, "12 metadata keys, over the limit of 10"),
        ("MAX_TENSORS", {}, "1 tensors, over the limit of 0"),
    ],
)
def test_it_reads_no_more_than_its_bounds_of_a_header(tmp_path, monkeypatch, bound, kw, what):
    """A header declaring more entries than the reader parses is refused before they are
    parsed (each costs Python objects: billions would cost the process its memory)."""
    from inference.packages import gguf_files

    monkeypatch.setattr(gguf_files, bound, 0 if bound == "MAX_TENSORS" else 10, raising=False)
    path = small_gguf(tmp_path / "m.gguf", **kw)
    with pytest.raises(NotGguf) as raised:
        read_facts(path)
    size = path.stat().st_size
    assert str(raised.value) == f"GGUF not read ({size:,} bytes): it declares {what}"


def test_it_says_a_missing_file_cannot_be_read(tmp_path):
    with pytest.raises(NotGguf, match=r"^cannot read .*missing\.gguf: No such file or directory$"):
        read_facts(tmp_path / "missing.gguf")


def test_it_writes_a_copy_with_a_new_chat_template(model, model_tensors, tmp_path):
    copy = tmp_path / "templated.gguf"

    write_with_chat_template(model, copy, TEMPLATE)

    facts = read_facts(copy)
    assert facts.chat_template == TEMPLATE
    assert facts.chat_template_sha256 == hashlib.sha256(TEMPLATE.encode()).hexdigest()
    assert tensors(copy) == model_tensors
    before, after = fields(model), fields(copy)
    assert after.pop("tokenizer.chat_template") == TEMPLATE
    before.pop("tokenizer.chat_template")
    assert after == before
    assert [p.name for p in tmp_path.iterdir()] == ["templated.gguf"]  # no temporary file left


def test_it_removes_the_chat_template_when_given_none(model, model_tensors, bare_gguf):
    copy = bare_gguf  # write_with_chat_template(model, copy, None), shared by the package tests

    facts = read_facts(copy)
    assert (facts.chat_template, facts.chat_template_sha256) == ("", "")
    assert "tokenizer.chat_template" not in fields(copy)
    assert facts.quantization == "Q4_1"
    assert tensors(copy) == model_tensors


def test_it_replaces_the_template_of_a_file_in_place(model, tmp_path):
    own = tmp_path / "own.gguf"
    shutil.copyfile(model, own)

    write_with_chat_template(own, own, TEMPLATE)

    assert read_facts(own).chat_template == TEMPLATE
    assert [p.name for p in tmp_path.iterdir()] == ["own.gguf"]


def test_it_leaves_the_target_alone_when_the_source_is_not_gguf(tmp_path):
    source = tmp_path / "notes.txt"
    source.write_text("hello")
    target = tmp_path / "target.gguf"
    target.write_bytes(b"previous")

    with pytest.raises(NotGguf):
        write_with_chat_template(source, target, TEMPLATE)

    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "target.gguf"]


def test_it_dequantizes_every_weight_to_f16(model, tmp_path):
    f16 = tmp_path / "model-f16.gguf"
    seen: list[float] = []

    dequantize_to_f16(model, f16, progress=seen.append)

    source, facts = read_facts(model), read_facts(f16)
    assert facts.quantization == "F16"
    assert facts.tensor_types == {"F16": 211, "F32": 61}
    assert facts.parameters == source.parameters
    assert facts.chat_template == source.chat_template
    assert len(seen) == facts.tensor_count
    assert seen == sorted(seen) and seen[-1] == 1.0
    quantized = {t.name: t for t in gguf.GGUFReader(model).tensors}
    for tensor in gguf.GGUFReader(f16).tensors[:8]:
        original = quantized[tensor.name]
        expected = gguf.quants.dequantize(original.data, original.tensor_type)
        if tensor.tensor_type == gguf.GGMLQuantizationType.F16:
            expected = expected.astype(np.float16)
        assert np.array_equal(tensor.data, expected), tensor.name
