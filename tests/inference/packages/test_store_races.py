"""A stored file is never removed while anything may still use it: two writers of the same
bytes, a delete or a job's clean-up racing a writer. Each bad interleaving is forced with
events inside the writer's step that reads the stored file (``services._read_facts``), never
with sleeps: the writer has stored (or found) the file and not yet registered it."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from django.db import connection

from console.lib.errors import Conflict
from inference.models import ModelPackage, PackageJob
from inference.packages import jobs, services, uploads

pytestmark = pytest.mark.django_db(transaction=True)
WAIT_S = 30  # an event that never comes fails the test instead of hanging it


def tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A small valid GGUF (one F32 tensor) whose bytes depend on ``seed``."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.context_length", 512)
    writer.add_tensor("w", np.full((4, 8), seed, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def row(name: str, version: str, path: Path, sha256: str) -> ModelPackage:
    return ModelPackage.objects.create(
        name=name, version=version, family=name, gguf_path=str(path), sha256=sha256
    )


class Paced:
    """Stands in for ``services._read_facts``: the thread named ``first`` signals ``stored``
    when it reaches it; any other thread signals ``second_stored`` and then waits for
    ``first_done`` (before reading the file, or after when ``read_first``) -- the moment a
    second writer holds the same file and has not yet registered it."""

    def __init__(self, *, read_first: bool = False) -> None:
        self.real = services._read_facts
        self.read_first = read_first
        self.stored = threading.Event()
        self.second_stored = threading.Event()
        self.first_done = threading.Event()

    def __call__(self, path: Path):
        if threading.current_thread().name == "first":
            self.stored.set()
            facts = self.real(path)
            self.second_stored.wait(WAIT_S)  # let the second writer reach its hold
            return facts
        facts = self.real(path) if self.read_first else None
        self.second_stored.set()
        assert self.first_done.wait(WAIT_S)
        return facts if self.read_first else self.real(path)


def in_thread(name: str, work: Callable[[], object], outcome: dict, done=None) -> threading.Thread:
    def run() -> None:
        try:
            outcome[name] = work()
        except BaseException as exc:  # the outcome, kept for the test to read
            outcome[name] = exc
        finally:
            connection.close()
            if done is not None:
                done.set()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


def finished_upload(name: str, version: str | None, source: Path) -> str:
    data = source.read_bytes()
    up = uploads.upload_begin(name=name, version=version, size=len(data), filename=source.name)
    uploads.upload_append(upload_id=up.id, offset=0, data=data)
    return up.id


@pytest.mark.parametrize("read_first", [False, True], ids=["reads-after", "reads-before"])
def test_a_refused_upload_keeps_the_file_another_upload_of_the_same_bytes_registers(
    home, tmp_path, monkeypatch, read_first
):
    """Upload A names an existing ``name:version`` (another file) and is refused with 409;
    upload B of the same bytes, a new version, stored its copy while A still held the file.
    B is registered and its file is there (the old code removed it on A's 409: B failed
    reading it, or registered a version whose file was gone)."""
    source = tiny_gguf(tmp_path / "m.gguf")
    sha256 = hashlib.sha256(source.read_bytes()).hexdigest()
    row("m", "1", tmp_path / "other.gguf", "f" * 64)
    a, b = finished_upload("m", "1", source), finished_upload("m2", "1", source)
    paced = Paced(read_first=read_first)
    monkeypatch.setattr(services, "_read_facts", paced)
    outcome: dict = {}
    first = in_thread(
        "first", lambda: uploads.upload_finish(upload_id=a), outcome, paced.first_done
    )
    assert paced.stored.wait(WAIT_S)
    second = in_thread("second", lambda: uploads.upload_finish(upload_id=b), outcome)
    first.join(WAIT_S * 2)
    second.join(WAIT_S * 2)
    assert isinstance(outcome["first"], Conflict)
    assert outcome["first"].message.startswith("m:1 exists with another file")
    assert not isinstance(outcome["second"], BaseException), outcome["second"]
    package = outcome["second"].package
    assert (package.key, package.sha256, outcome["second"].created) == ("m2:1", sha256, True)
    assert Path(package.gguf_path).read_bytes() == source.read_bytes()


def test_deleting_the_last_version_of_a_file_keeps_it_while_a_writer_registers_it(
    home, tmp_path, monkeypatch
):
    """``package_delete`` of the only version of a file while an import of the same bytes
    has stored it and not yet registered: the file stays and the import registers; deleting
    that version afterwards, with nothing holding the file, removes it."""
    source = tiny_gguf(tmp_path / "m.gguf")
    old = services.package_import_file(path=source, name="old", source={"kind": "import"})
    stored_path = Path(old.package.gguf_path)
    paced = Paced()
    monkeypatch.setattr(services, "_read_facts", paced)
    outcome: dict = {}
    writer = in_thread(
        "second",
        lambda: services.package_import_file(path=source, name="new", source={"kind": "import"}),
        outcome,
    )
    assert paced.second_stored.wait(WAIT_S)
    services.package_delete(package_id=old.package.pk)
    assert stored_path.exists()
    paced.first_done.set()
    writer.join(WAIT_S * 2)
    assert not isinstance(outcome["second"], BaseException), outcome["second"]
    assert Path(outcome["second"].package.gguf_path) == stored_path and stored_path.exists()
    services.package_delete(package_id=outcome["second"].package.pk)
    assert not stored_path.exists()


def test_a_job_clean_up_spares_an_old_unregistered_file_a_writer_holds(home, tmp_path, monkeypatch):
    """A cancelled or dead job's clean-up sweeps stored files no version refers to once they
    are an hour old; one a writer has stored and is registering is spared however old, and
    registered."""
    source = tiny_gguf(tmp_path / "m.gguf")
    paced = Paced()

    def aged(path: Path):  # the file was stored long ago as far as the sweep can tell
        hours_ago = time.time() - 7200
        os.utime(path, (hours_ago, hours_ago))
        return paced(path)

    monkeypatch.setattr(services, "_read_facts", aged)
    outcome: dict = {}
    writer = in_thread(
        "second",
        lambda: services.package_import_file(path=source, name="m", source={"kind": "import"}),
        outcome,
    )
    assert paced.second_stored.wait(WAIT_S)
    job = PackageJob.objects.create(kind="import", state=PackageJob.State.RUNNING)
    jobs._clean_up(job, PackageJob.State.CANCELLED, "cancelled")
    paced.first_done.set()
    writer.join(WAIT_S * 2)
    assert not isinstance(outcome["second"], BaseException), outcome["second"]
    assert Path(outcome["second"].package.gguf_path).exists()


def test_a_failed_import_removes_the_file_it_stored_when_nothing_else_holds_it(home, tmp_path):
    source = tiny_gguf(tmp_path / "m.gguf")
    row("m", "1", tmp_path / "other.gguf", "f" * 64)
    with pytest.raises(Conflict, match="m:1 exists with another file"):
        services.package_import_file(path=source, name="m", version="1", source={"kind": "x"})
    assert not list((home / "packages" / "sha256").glob("*/*.gguf"))


def test_the_sweep_spares_a_held_file_and_leaves_no_lock_files_behind(tmp_path):
    from inference.packages.store import PackageStore

    store = PackageStore(tmp_path / "packages")
    free = store.add_file(tiny_gguf(tmp_path / "a.gguf", seed=1))
    held = store.add_file(tiny_gguf(tmp_path / "b.gguf", seed=2))
    free.release()
    hours_ago = time.time() - 7200
    for stored in (free, held):
        os.utime(stored.path, (hours_ago, hours_ago))

    def locks() -> list[str]:
        return sorted(p.stem for p in (store.root / "locks").glob("*/*.lock"))

    assert store.collect_garbage(lambda sha256: False) == [free.path]
    assert held.path.exists() and locks() == [held.sha256]
    held.release()
    assert store.collect_garbage(lambda sha256: False) == [held.path]
    assert locks() == []
