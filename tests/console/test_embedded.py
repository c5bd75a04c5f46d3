from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from console import embedded
from inference.models import ApiToken, ModelPackage
from inference.tokens import token_authenticate
from nodes.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def model_file(tmp_path, monkeypatch, settings):
    from tests.support.processes import bundled_model_path

    path = bundled_model_path()  # the real file: it is imported into the package store
    settings.VAR_DIR = tmp_path / "home"
    monkeypatch.setattr(embedded, "ensure_bundled_model", lambda model_dir: path)
    monkeypatch.delenv("PHALANX_API_TOKEN", raising=False)
    monkeypatch.delenv("PHALANX_OPERATOR_PASSWORD", raising=False)
    monkeypatch.delenv("PHALANX_ADMIN_PASSWORD", raising=False)
    return path


def test_it_bootstraps_the_inventory_idempotently(model_file):
    first = embedded.array_bootstrap(nodes=2)
    second = embedded.array_bootstrap(nodes=2)
    assert ModelPackage.objects.filter(kind="chat").count() == 1
    package = ModelPackage.objects.get(kind="chat")
    # and the semantic cache's encoder, registered once and gated by its evaluation
    [encoder] = ModelPackage.objects.filter(kind="embedding")
    assert encoder.name == "all-minilm-l6-v2" and encoder.status == "approved"
    assert package.name == embedded.BUNDLED_PACKAGE_NAME and package.quantization == "Q4_1"
    assert package.status == "draft" and package.gguf_path.endswith(f"{package.sha256}.gguf")
    assert first.model_path == second.model_path == Path(package.gguf_path)
    assert list(Node.objects.values_list("node_id", "address")) == [
        ("node-01", "127.0.0.1:8001"),
        ("node-02", "127.0.0.1:8002"),
    ]
    assert all(n.package_id == package.pk and n.cpu_set for n in Node.objects.all())
    assert first.admin_password and second.admin_password is None
    assert get_user_model().objects.get(username="admin").is_superuser
    assert token_authenticate(raw=first.api_token) and token_authenticate(raw=second.api_token)
    assert ApiToken.objects.count() == 2


def test_it_uses_the_environment_token_instead_of_minting(model_file, monkeypatch):
    monkeypatch.setenv("PHALANX_API_TOKEN", "automation")
    result = embedded.array_bootstrap(nodes=1)
    assert result.api_token is None and not ApiToken.objects.exists()


def test_it_rejects_zero_nodes(model_file):
    with pytest.raises(ValueError):
        embedded.array_bootstrap(nodes=0)


def test_it_builds_the_node_command_line(model_file):
    result = embedded.array_bootstrap(nodes=1)
    argv = embedded.node_command(result.nodes[0], model_path=model_file, package=result.package)
    assert argv[2:] == [
        "runnode",
        "--id",
        "node-01",
        "--listen",
        "127.0.0.1:8001",
        "--model",
        str(model_file),
        "--package",
        embedded.BUNDLED_PACKAGE_NAME,
        "--sha256",
        result.package.sha256,
        "--threads",
        "1",
        "--cpus",
        result.nodes[0].cpu_set,
    ]
    budget = embedded.node_command(
        result.nodes[0], model_path=model_file, package=result.package, host_ram_mib=3072
    )
    assert budget[-2:] == ["--host-ram-mib", "3072"]


def test_the_default_host_ram_budget_is_a_share_of_free_memory_split_among_local_nodes():
    from inference.engine.config import default_host_ram_mib

    assert default_host_ram_mib(24 << 30) == 6144  # a quarter of 24 GiB
    assert default_host_ram_mib(24 << 30, nodes_on_machine=2) == 3072
    assert default_host_ram_mib(512 << 20) == 256  # never under 256 MiB


def test_it_stops_every_child():
    supervisor = embedded.Supervisor()
    for name in ("a", "b"):
        supervisor.start(name, [sys.executable, "-c", "import time; time.sleep(60)"])
    supervisor.stop(timeout=5)
    assert [code is not None for _, code in supervisor.exited()] == [True, True]


def test_it_kills_a_child_that_ignores_sigterm(tmp_path):
    import time

    ready = tmp_path / "ready"
    supervisor = embedded.Supervisor()
    supervisor.start(
        "stubborn",
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            "open(sys.argv[1], 'w').close(); time.sleep(60)",
            str(ready),
        ],
    )
    for _ in range(200):
        if ready.exists():
            break
        time.sleep(0.05)
    supervisor.stop(timeout=0.5)
    assert supervisor.exited()[0][1] == -9


def test_up_stops_with_a_clear_message_when_a_port_is_taken(tmp_path) -> None:
    """A second array on the same machine must not start on the first one's ports."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "manage.py", "up", "--nodes", "1", "--port", str(port - 1)],
            env={**os.environ, "PHALANX_HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode != 0
    assert "taken: " in done.stderr and f"127.0.0.1:{port}" in done.stderr
    assert not (tmp_path / "phalanx.sqlite3").exists()  # stopped before it touched anything


def test_restarts_back_off_and_a_stable_child_starts_over() -> None:
    backoff = embedded.Backoff(first_s=1, max_s=60)
    assert [backoff.delay(n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_a_restart_of_the_array_keeps_what_an_upgrade_gave_each_node(model_file, tmp_path):
    """``up`` after an upgrade: the node keeps its new version, served name and rolled
    settings, and is started (or restarted by the supervisor) with that version's file, not
    the bundled one."""
    from inference.models import ModelPackage
    from nodes.models import Node

    first = embedded.array_bootstrap(nodes=2)
    newer_file = tmp_path / "newer.gguf"
    newer_file.write_bytes(b"GGUF")
    newer = ModelPackage.objects.create(
        name="smol-q4_k_m", version="1", gguf_path=str(newer_file), sha256="c" * 64
    )
    Node.objects.filter(node_id="node-02").update(
        package=newer,
        served_name=embedded.BUNDLED_PACKAGE_NAME,
        threads=2,
        engine_settings={"sequences": 4, "ctx_per_seq": 4096},
    )
    again = embedded.array_bootstrap(nodes=2)
    assert [n.package_id for n in again.nodes] == [first.package.pk, newer.pk]
    argv = embedded.node_command_now("node-02", fallback=model_file)
    assert argv[argv.index("--model") + 1] == str(newer_file)
    assert argv[argv.index("--package") + 1] == embedded.BUNDLED_PACKAGE_NAME
    assert argv[argv.index("--sha256") + 1] == "c" * 64
    assert argv[argv.index("--threads") + 1] == "2"
    assert argv[-4:] == ["--sequences", "4", "--ctx-per-seq", "4096"]
    newer_file.unlink()  # the file is gone: the bundled one, rather than no node
    argv = embedded.node_command_now("node-02", fallback=model_file)
    assert argv[argv.index("--model") + 1] == str(model_file)
    assert argv[argv.index("--sha256") + 1] == first.package.sha256
