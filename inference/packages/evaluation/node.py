"""The evaluation's node agent: ``manage.py runnode`` on loopback with a fresh credential."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from console.lib.processes import die_with_parent

REPO_ROOT = Path(__file__).resolve().parents[3]  # the directory holding manage.py
START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_CHARS = 4000


class NodeStartFailed(RuntimeError):
    """The evaluation node exited, or was not healthy within ``START_TIMEOUT_S`` (a GGUF that
    does not load, a chat template that does not parse ...). ``log_tail``: the end of its log."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(f"{message}\n{log_tail}" if log_tail else message)
        self.log_tail = log_tail


@dataclass
class EvalNode:
    """A node agent started by ``start_eval_node``; a context manager that stops it on exit.
    ``url``: ``http://127.0.0.1:<port>``; ``headers``: its ``Authorization``."""

    process: subprocess.Popen[bytes]
    url: str
    credential: str
    log_path: Path
    package: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}"}

    def client(self, timeout: float = REQUEST_TIMEOUT_S) -> httpx.Client:
        """An ``httpx.Client`` on the node's URL with its credential."""
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of the node's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``; waits for the process to end."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> EvalNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_eval_node(
    gguf_path: Path | str,
    *,
    log_path: Path | str,
    threads: int = 1,
    sequences: int = 4,
    ctx_per_seq: int = 2048,
    package_name: str = "eval",
) -> EvalNode:
    """Start ``manage.py runnode`` serving ``gguf_path`` as ``package_name`` on a free loopback
    port, accepting a fresh random credential, its output in ``log_path``; return once
    ``GET /health`` answers 200. Raises ``NodeStartFailed`` (the node is stopped) when the
    process exits, reports a load error, or is not healthy within ``START_TIMEOUT_S``."""
    from nodes.agent.auth import ENV_CREDENTIAL

    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    credential = secrets.token_urlsafe(32)
    args = [
        sys.executable,
        "manage.py",
        "runnode",
        "--id",
        f"eval-{secrets.token_hex(3)}",
        "--listen",
        f"127.0.0.1:{port}",
        "--model",
        str(gguf_path),
        "--package",
        package_name,
        "--sequences",
        str(sequences),
        "--ctx-per-seq",
        str(ctx_per_seq),
        "--threads",
        str(threads),
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, ENV_CREDENTIAL: credential},
            start_new_session=True,
            # a job process that dies without stopping it (SIGKILL, a stopped array) takes
            # it along: an orphan would keep a core busy and its port taken
            preexec_fn=die_with_parent,
        )
    node = EvalNode(process, f"http://127.0.0.1:{port}", credential, log_path, package_name)
    try:
        _wait_healthy(node)
    except BaseException:
        node.stop()
        raise
    return node


def _wait_healthy(node: EvalNode) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if node.process.poll() is not None:
            raise NodeStartFailed(
                f"the node exited with status {node.process.returncode}", node.log_tail()
            )
        try:
            health = httpx.get(f"{node.url}/health", timeout=2.0)
        except httpx.HTTPError:
            health = None
        if health is not None and health.status_code == 200:
            return
        if health is not None and health.status_code == 500:  # the engine failed to load
            error = health.json().get("error", "") if _is_json(health) else health.text
            raise NodeStartFailed(f"the node could not load the model: {error}", node.log_tail())
        time.sleep(0.25)
    raise NodeStartFailed(
        f"the node was not healthy after {START_TIMEOUT_S:.0f} s", node.log_tail()
    )


def _is_json(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/json")
