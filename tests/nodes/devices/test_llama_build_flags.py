"""The instruction sets the Makefile builds llama-cpp-python with follow the CPU it runs on:
x86-64-v3 always, the AVX-512 and VNNI sets where /proc/cpuinfo lists them, AMX never."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BASE = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
AVX2_ONLY = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c avx2 fma bmi2"
AVX512 = "avx512f avx512cd avx512vl avx512dq avx512bw"
SAPPHIRE_RAPIDS = (
    f"{AVX2_ONLY} {AVX512} avx512ifma avx_vnni avx512_bf16 avx512vbmi avx512_vnni amx_bf16 "
    "amx_tile amx_int8"
)

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the x86 instruction sets apply to x86_64 builds"
)


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / f"cpuinfo-{abs(hash(flags))}"
    path.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\n\n")
    return path


def make(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CMAKE_ARGS", "MAKEFLAGS")}
    return subprocess.run(
        ["make", "-s", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout


def test_an_avx2_cpu_gets_the_x86_64_v3_build(tmp_path):
    assert make("llama-cmake-args", f"CPUINFO={cpuinfo(tmp_path, AVX2_ONLY)}").strip() == BASE


def test_an_avx512_cpu_gets_its_sets_built_in_but_never_amx(tmp_path):
    flags = make("llama-cmake-args", f"CPUINFO={cpuinfo(tmp_path, SAPPHIRE_RAPIDS)}").split()
    assert flags[: len(BASE.split())] == BASE.split()
    for option in ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AVX_VNNI"):
        assert f"-DGGML_{option}=ON" in flags
    assert not [f for f in flags if "AMX" in f or "NATIVE=ON" in f]


def test_avx512_needs_every_set_ggml_compiles_it_with(tmp_path):
    """GGML_AVX512 compiles with -mavx512f/cd/vl/dq/bw: a CPU lacking one (avx512bw here, as
    Knights Landing) gets none of the AVX-512 options, and its AVX-VNNI only if listed."""
    partial = f"{AVX2_ONLY} avx512f avx512cd avx512vl avx512dq avx512_vnni"
    flags = make("llama-cmake-args", f"CPUINFO={cpuinfo(tmp_path, partial)}")
    assert "AVX512" not in flags and "VNNI" not in flags


def test_the_wheel_built_is_the_one_for_these_flags(tmp_path):
    """A dry run of a fresh install builds (or takes from the cache) the wheel with the CPU's
    flags."""
    venv = tmp_path / "venv"
    out = make("-n", "install", f"VENV={venv}", f"CPUINFO={cpuinfo(tmp_path, SAPPHIRE_RAPIDS)}")
    wheel = next(line for line in out.splitlines() if "pip wheel" in line)
    assert "-DGGML_AVX512_VNNI=ON" in wheel and "AMX" not in wheel


def test_a_venv_built_for_other_flags_is_installed_again(tmp_path):
    """The venv records its flags; they are rewritten (so ``.installed``, which depends on them,
    is remade) when this machine's differ, and left alone, same time, when they do not."""
    venv = tmp_path / "venv"
    record = venv / ".llama-cmake-args"
    avx2, avx512 = cpuinfo(tmp_path, AVX2_ONLY), cpuinfo(tmp_path, SAPPHIRE_RAPIDS)
    make(str(record), f"VENV={venv}", f"CPUINFO={avx512}")
    assert "-DGGML_AVX512=ON" in record.read_text()
    os.utime(record, (1_000_000, 1_000_000))
    make(str(record), f"VENV={venv}", f"CPUINFO={avx512}")
    assert record.stat().st_mtime == 1_000_000  # same CPU: nothing to install again
    make(str(record), f"VENV={venv}", f"CPUINFO={avx2}")
    assert record.read_text().strip() == BASE and record.stat().st_mtime > 1_000_000
