"""The instruction sets the Makefile builds llama-cpp-python with follow the CPU it runs on:
x86-64-v3 always, the AVX-512 and VNNI sets where /proc/cpuinfo lists them, AMX never."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

from nodes.devices.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[3]
BASE = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
AVX2_ONLY = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c avx2 fma bmi2"
AVX512 = "avx512f avx512cd avx512vl avx512dq avx512bw"
SAPPHIRE_RAPIDS = (
    f"{AVX2_ONLY} {AVX512} avx512ifma avx_vnni avx512_bf16 avx512vbmi avx512_vnni amx_bf16 "
    "amx_tile amx_int8"
)
# what a make run started from a make (make test) would inherit and these runs must not
MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "LLAMA_CMAKE_ARGS", "LLAMA_EXTRA_CMAKE_ARGS")

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the x86 instruction sets apply to x86_64 builds"
)


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / f"cpuinfo-{abs(hash(flags))}"
    path.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\n\n")
    return path


def make(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in MAKE_ENV}
    return subprocess.run(
        ["make", "-s", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout


def flags_for(tmp_path: Path, cpu_flags: str) -> str:
    return make("llama-cmake-args", f"CPUINFO={cpuinfo(tmp_path, cpu_flags)}").strip()


def test_an_avx2_cpu_gets_the_x86_64_v3_build(tmp_path):
    assert flags_for(tmp_path, AVX2_ONLY) == BASE


def test_an_avx512_cpu_gets_its_sets_built_in_but_never_amx(tmp_path):
    assert flags_for(tmp_path, SAPPHIRE_RAPIDS) == (
        f"{BASE} -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
        "-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON"
    )


@pytest.mark.parametrize(
    ("cpu", "cpu_flags", "added"),
    [
        ("Skylake-SP", f"{AVX2_ONLY} {AVX512}", "-DGGML_AVX512=ON"),
        (
            "Cascade Lake",
            f"{AVX2_ONLY} {AVX512} avx512_vnni",
            "-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON",
        ),
        ("Alder Lake", f"{AVX2_ONLY} avx_vnni", "-DGGML_AVX_VNNI=ON"),
        # GGML_AVX512 compiles with -mavx512f/cd/vl/dq/bw: without bw (Knights Landing) none of
        # the AVX-512 options, VNNI included
        ("Knights Landing", f"{AVX2_ONLY} avx512f avx512cd avx512vl avx512dq avx512_vnni", ""),
    ],
)
def test_each_set_is_added_only_where_the_cpu_lists_it(tmp_path, cpu, cpu_flags, added):
    assert flags_for(tmp_path, cpu_flags) == f"{BASE} {added}".strip(), cpu


def test_the_wheel_built_is_the_one_for_these_flags(tmp_path):
    """A dry run of a fresh install builds (or takes from the cache) the wheel with the CPU's
    flags."""
    venv = tmp_path / "venv"
    out = make("-n", "install", f"VENV={venv}", f"CPUINFO={cpuinfo(tmp_path, SAPPHIRE_RAPIDS)}")
    wheel = next(line for line in out.splitlines() if "pip wheel" in line)
    assert "-DGGML_AVX512_VNNI=ON" in wheel and "AMX" not in wheel


def test_a_venv_is_installed_again_only_when_its_cpu_lists_other_sets(tmp_path):
    """The install rule itself, run with ``true`` for Python (nothing is installed): a second
    run on the same CPU does nothing, a run where the CPU lists other sets (a disk moved to
    another machine) installs again and records the new flags, and so does a later one back."""
    venv, home = tmp_path / "venv", tmp_path / "home"
    avx2, avx512 = cpuinfo(tmp_path, AVX2_ONLY), cpuinfo(tmp_path, SAPPHIRE_RAPIDS)
    fake = ["PYTHON=true", "PY=true", f"HOME={home}", f"VENV={venv}"]
    installed, record = venv / ".installed", venv / ".llama-cmake-args"

    def install(cpu: Path) -> float:
        make("install", *fake, f"CPUINFO={cpu}")
        return installed.stat().st_mtime_ns

    first = install(avx512)
    assert "-DGGML_AVX512_VNNI=ON" in record.read_text()
    assert install(avx512) == first
    assert make("-n", "install", *fake, f"CPUINFO={avx512}") == ""  # a dry run says so too
    moved = install(avx2)
    assert moved > first and record.read_text().strip() == BASE
    assert install(avx2) == moved and install(avx512) > moved


def test_the_advised_rebuild_reaches_the_build_with_its_option(tmp_path):
    """``make -n -B install LLAMA_EXTRA_CMAKE_ARGS=...`` (what ``cpu.build`` advises; a dry run,
    on an AVX2 CPU whose own flags do not add the option): pip builds a wheel with the
    Makefile's flags plus the option, instead of "Nothing to be done"."""
    cpu = f"CPUINFO={cpuinfo(tmp_path, AVX2_ONLY)}"
    asked = "LLAMA_EXTRA_CMAKE_ARGS=-DGGML_AVX512=ON -DPHALANX_ASKED=ON"
    out = make("-n", "-B", "install", f"VENV={tmp_path / 'venv'}", cpu, asked)
    wheel = next(line for line in out.splitlines() if "pip wheel" in line)
    assert f"{BASE} -DGGML_AVX512=ON -DPHALANX_ASKED=ON" in wheel


def test_an_asked_rebuild_is_kept_by_a_later_plain_install(tmp_path):
    """What ``cpu.build``'s advice builds (``make -B install LLAMA_EXTRA_CMAKE_ARGS=...``) stays
    installed through the next ``make run`` or ``make test`` on the same CPU."""
    venv = tmp_path / "venv"
    fake = ["PYTHON=true", "PY=true", f"HOME={tmp_path / 'home'}", f"VENV={venv}"]
    cpu = f"CPUINFO={cpuinfo(tmp_path, AVX2_ONLY)}"
    make("-B", "install", *fake, cpu, "LLAMA_EXTRA_CMAKE_ARGS=-DGGML_AVX512=ON")
    asked = (venv / ".installed").stat().st_mtime_ns
    make("install", *fake, cpu)
    assert (venv / ".installed").stat().st_mtime_ns == asked
    assert "-DGGML_AVX512=ON" in (venv / ".llama-cmake-args").read_text()


def test_every_option_validation_advises_is_one_the_install_adds_by_itself(tmp_path):
    """``cpu.build`` (``matrix.yaml``) names an option for a set the CPU lists and the build
    lacks; the Makefile adds that same option on such a CPU, so the advice is only ever needed
    for a build made by hand (the two lists cannot drift apart)."""
    cpu = load_matrix()["cpu"]
    options = cpu["build_options"]
    advised = {
        flag: options[name] for flag, name in cpu["build_features"].items() if name in options
    }
    assert advised  # AVX512, AVX512_VNNI, AVX_VNNI
    for flag, option in advised.items():
        assert option in flags_for(tmp_path, f"{AVX2_ONLY} {AVX512} {flag}").split(), flag
