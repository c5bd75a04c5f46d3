"""Quantized builds of the bundled SmolLM2-135M (Q4_1, hidden size 576: not a multiple of 256,
so llama.cpp's K-quants mostly fall back to other types on it)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from inference.engine.quantize import QuantizeError, quantize
from inference.packages.build import build_quantized
from inference.packages.gguf_files import NotGguf, read_facts
from tests.support.processes import bundled_model_path

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model() -> Path:
    return bundled_model_path()


@pytest.fixture
def dirs(tmp_path) -> tuple[Path, Path]:
    """(where the output goes, the build's work directory)."""
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    return out, work


def listing(*folders: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder.parent)) for folder in folders for p in folder.rglob("*")
    )


def test_it_builds_q8_0_from_an_f16_copy_of_the_source(model, dirs):
    out, work = dirs
    steps: list[tuple[float, str]] = []

    report = build_quantized(
        model,
        out / "smol-q8_0.gguf",
        "Q8_0",
        workdir=work,
        progress=lambda f, m: steps.append((f, m)),
    )

    facts = read_facts(out / "smol-q8_0.gguf")
    assert facts.quantization == "Q8_0"
    assert facts.tensor_types == {"Q8_0": 211, "F32": 61}
    assert (report.method, report.dequantized, report.source_quantization) == ("f16", True, "Q4_1")
    assert report.tensor_types == facts.tensor_types
    assert (report.quantized_tensors, report.fallback_count, report.mostly_fell_back) == (
        211,
        0,
        False,
    )
    assert report.size_bytes == facts.size_bytes
    assert json.loads(json.dumps(report.as_dict()))["requested"] == "Q8_0"
    fractions = [f for f, _ in steps]
    assert fractions == sorted(fractions) and (fractions[0], fractions[-1]) == (0.0, 1.0)
    messages = [m for _, m in steps]
    assert "dequantizing SmolLM2-135M-Instruct.Q4_1.gguf to F16" in messages
    assert any(m.startswith("quantizing to Q8_0: tensor 272 of 272 ") for m in messages)
    assert listing(out, work) == ["out/smol-q8_0.gguf"]  # the F16 copy is gone


def test_it_requantizes_to_q4_0_with_one_fallback(model, dirs):
    out, work = dirs
    lines: list[str] = []

    report = build_quantized(
        model, out / "smol-q4_0.gguf", "Q4_0", method="requantize", workdir=work, log=lines.append
    )

    assert read_facts(out / "smol-q4_0.gguf").quantization == "Q4_0"
    assert not report.dequantized
    # the tied embedding is the output matrix: llama.cpp wants Q6_K for it and falls back
    assert report.tensor_types == {"Q4_0": 210, "F32": 61, "Q8_0": 1}
    assert (report.fallback_count, report.fallback_types) == (1, {"Q8_0": 1})
    assert not report.mostly_fell_back
    assert lines[-1].endswith("WARNING: 1 of 272 tensor(s) required fallback quantization")
    assert report.log_tail == lines[-50:]


def test_it_says_when_a_k_quant_mostly_fell_back(model, dirs):
    out, work = dirs

    report = build_quantized(
        model, out / "smol-q4_k_m.gguf", "Q4_K_M", method="requantize", workdir=work
    )

    assert report.quantization == "Q4_K_M"
    assert report.fallback_count == 180
    assert report.fallback_types == {"Q5_0": 166, "Q8_0": 14}
    assert report.mostly_fell_back
    assert report.tensor_types["Q4_K"] == 16


def test_it_leaves_nothing_when_the_target_is_unknown(model, dirs):
    out, work = dirs

    with pytest.raises(
        QuantizeError, match=r"^unknown quantization type 'Q9_9': one of F16, Q8_0,"
    ):
        build_quantized(model, out / "smol.gguf", "Q9_9", workdir=work)

    assert listing(out, work) == []


def test_it_leaves_nothing_when_the_source_is_not_gguf(dirs, tmp_path):
    out, work = dirs
    source = tmp_path / "weights.zip"
    source.write_bytes(b"PK\x03\x04" + bytes(64))

    with pytest.raises(NotGguf, match=r"^not a GGUF file: it starts with b'PK\\x03\\x04'"):
        build_quantized(source, out / "smol.gguf", "Q8_0", workdir=work)

    assert listing(out, work) == []


def test_it_leaves_nothing_when_llama_cpp_fails(dirs, tmp_path):
    out, work = dirs
    source = tmp_path / "strange.gguf"  # a valid GGUF of an architecture llama.cpp does not know
    writer = gguf.GGUFWriter(source, arch="no-such-arch")
    writer.add_tensor("blk.0.weight", np.ones((32, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    with pytest.raises(
        QuantizeError, match=r"^llama\.cpp could not quantize strange\.gguf to Q8_0: "
    ):
        build_quantized(source, out / "smol.gguf", "Q8_0", workdir=work)

    assert listing(out, work) == []


def test_it_refuses_to_requantize_unless_allowed(model, tmp_path):
    target = tmp_path / "q8.gguf"

    with pytest.raises(QuantizeError) as raised:
        quantize(model, target, "Q8_0", allow_requantize=False, threads=1)

    assert str(raised.value) == (
        "llama.cpp could not quantize SmolLM2-135M-Instruct.Q4_1.gguf to Q8_0: "
        "requantizing from type q4_1 is disabled"
    )
    assert not target.exists()
