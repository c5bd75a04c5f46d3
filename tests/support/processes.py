"""Real processes on loopback for integration tests and benchmarks: node agents and friends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_port_block(count: int, host: str = "127.0.0.1", *, avoid: tuple[int, ...] = ()) -> int:
    """The first of ``count`` consecutive ports free on ``host`` now (``up --node-port``
    takes the ports after it), none of them in ``avoid``."""
    for _ in range(200):
        base = free_port(host)
        ports = range(base, base + count)
        if any(p in avoid or p > 65535 for p in ports):
            continue
        socks = []
        try:
            for port in ports:
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports on {host}")


def bundled_model_path() -> Path:
    from inference.bundled import ensure_bundled_model

    return ensure_bundled_model(REPO / "var" / "models")


@dataclass
class Proc:
    """A child process with its log file; ``stop()`` terminates it (then kills)."""

    popen: subprocess.Popen
    log_path: Path
    url: str = ""
    extra: dict = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # a node's: its credential

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def spawn(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> Proc:
    log = open(log_path, "wb")
    popen = subprocess.Popen(
        args,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    return Proc(popen=popen, log_path=log_path)


def wait_healthy(url: str, proc: Proc | None = None, timeout: float = 90.0) -> None:
    """Poll ``url/health`` until 200. Raises ``RuntimeError`` with the process log on failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(
                f"process exited with {proc.popen.returncode}:\n{proc.log()[-3000:]}"
            )
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not healthy after {timeout}s:\n{proc.log()[-3000:] if proc else ''}")


def start_node(
    node_id: str,
    log_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    threads: int = 1,
    cpus: str | None = None,
    extra_args: list[str] | None = None,
    wait: bool = True,
    credential: str | None = None,
    env: dict[str, str] | None = None,
) -> Proc:
    """Start ``manage.py runnode`` with the bundled model; returns when it is healthy.

    The node accepts ``credential`` (default: what this process's control plane presents to
    ``node_id``, ``nodes.credentials.node_credential``); ``proc.headers`` carries it. ``env``:
    more of its environment (``PHALANX_LOGS_URL`` to ship its log records)."""
    from nodes.agent.auth import ENV_CREDENTIAL
    from nodes.credentials import array_id, node_credential

    credential = credential or node_credential(node_id)
    port = port or free_port(host)
    args = [
        sys.executable,
        "manage.py",
        "runnode",
        "--id",
        node_id,
        "--listen",
        f"{host}:{port}",
        "--model",
        str(bundled_model_path()),
        "--package",
        "smollm2-135m-instruct-q4_1",
        "--threads",
        str(threads),
        *(["--cpus", cpus] if cpus else []),
        *(extra_args or []),
    ]
    env = {ENV_CREDENTIAL: credential, "PHALANX_ARRAY_ID": array_id(), **(env or {})}
    proc = spawn(args, log_dir / f"{node_id}.log", env=env)
    proc.url = f"http://{host}:{port}"
    proc.headers = {"Authorization": f"Bearer {credential}"}
    if wait:
        wait_healthy(proc.url, proc)
    return proc


def start_control_plane(
    port: int, log_dir: Path, env: dict[str, str] | None = None, *, host: str = "127.0.0.1"
) -> Proc:
    """Start the control plane (``manage.py serve``, daphne) on ``host``:``port``;
    returns at once (callers wait for what they need: ``/health``, ``/v1/models``...)."""
    args = [sys.executable, "manage.py", "serve", "--host", host, "--port", str(port)]
    proc = spawn(args, log_dir / "daphne.log", env=env)
    proc.url = f"http://{host}:{port}"
    return proc


def control_plane_at_home(home: Path, *, setup: str = "") -> tuple[Proc, str, dict[str, str]]:
    """A control plane on a fresh SQLite under ``PHALANX_HOME=home``: migrates, runs ``setup``
    (Python, in ``manage.py shell``), issues an admin API token and starts ``manage.py serve``
    on a free port, waiting for ``/health``. Returns the process (``url`` set), the token and
    the environment additions that other processes of this array need."""
    extra = {"PHALANX_HOME": str(home)}
    env = {**os.environ, **extra, "DJANGO_SETTINGS_MODULE": "console.settings"}
    env.pop("REDIS_URL", None)
    env.pop("DATABASE_URL", None)
    token = migrated_with_token(env, setup)
    plane = start_control_plane(free_port(), home, env=extra)
    wait_healthy(plane.url, plane, timeout=60)
    return plane, token, extra


def migrated_with_token(env: dict[str, str], setup: str = "") -> str:
    """Migrate the database of ``env`` (a whole process environment), run ``setup`` (Python, in
    ``manage.py shell``) and issue an admin API token; returns the token's plaintext."""
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=REPO, env=env, check=True)
    issue = (
        "from console.models import Role\nfrom inference.tokens import token_issue\n"
        'print(token_issue(name="tests", role=Role.ADMIN)[1])'
    )
    shell = subprocess.run(
        [*manage, "shell", "-c", f"{setup}\n{issue}"],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return shell.stdout.strip().splitlines()[-1]


def manage_shell(env: dict[str, str], code: str) -> None:
    """Run ``code`` in ``manage.py shell`` on the database of the array whose environment
    additions are ``env`` (``control_plane_at_home``'s third value)."""
    full = {**os.environ, **env, "DJANGO_SETTINGS_MODULE": "console.settings"}
    full.pop("DATABASE_URL", None)
    manage = [sys.executable, "manage.py", "shell", "-c", code]
    subprocess.run(manage, cwd=REPO, env=full, check=True, capture_output=True)
