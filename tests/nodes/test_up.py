"""``manage.py up --nodes 2`` for real, as an operator runs it: it names the OpenAI base URL
("ready") only once the array places sessions on both nodes, says each node's stage on the way,
and a normal boot never says a node went down."""

from __future__ import annotations

import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.support.processes import REPO, free_port

pytestmark = [pytest.mark.model, pytest.mark.e2e]


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))


def _read_until(lines: queue.Queue, marker: str, seen: list[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no line with {marker!r} in {timeout:g} s:\n" + "\n".join(seen)
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        seen.append(line)
        if marker in line:
            return line


def _nodes(home) -> dict[str, tuple[str, str]]:
    with sqlite3.connect(home / "phalanx.sqlite3") as db:
        rows = db.execute("select node_id, state, validation from nodes_node order by node_id")
        return {node_id: (state, validation) for node_id, state, validation in rows}


def _read_both(up: subprocess.Popen) -> tuple[queue.Queue, queue.Queue, list[threading.Thread]]:
    """Queues of ``up``'s stdout and stderr lines, read as they come (a full pipe would block
    up), and their started reader threads."""
    lines: queue.Queue = queue.Queue()
    errors: queue.Queue = queue.Queue()
    readers = [
        threading.Thread(target=_lines, args=(stream, into), daemon=True)
        for stream, into in ((up.stdout, lines), (up.stderr, errors))
    ]
    for reader in readers:
        reader.start()
    return lines, errors, readers


def test_up_says_ready_only_once_every_node_takes_sessions(tmp_path):
    """Then Ctrl-C in a terminal running ``make run`` and a SIGTERM passed on right after
    (make, a service manager): one line, no traceback, exit status 0, and no child left
    behind. (One ``up`` for both: each start validates its nodes for real.)"""
    (tmp_path / "models").symlink_to(REPO / "var" / "models")  # the bundled model, fetched once
    port = free_port()  # the nodes take the next two ports (up stops if they are taken)
    env = {**os.environ, "PHALANX_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.pop("DATABASE_URL", None)
    env.pop("PHALANX_SQLITE", None)
    command = [sys.executable, "manage.py", "up", "--nodes", "2", "--port", str(port)]
    up = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines, errors, readers = _read_both(up)
    seen: list[str] = []
    try:
        ready = _read_until(lines, "OpenAI base URL", seen, timeout=420)
        at_ready = _nodes(tmp_path)  # what routing reads, the moment up said so
        children = [c.pid for c in psutil.Process(up.pid).children()]
        up.send_signal(signal.SIGINT)
        up.send_signal(signal.SIGTERM)
        code = up.wait(60)
        for reader in readers:
            reader.join(30)
        while not lines.empty():
            seen.append(lines.get())
        stderr = "\n".join(errors.get() for _ in range(errors.qsize()))
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    log = "\n".join(seen)
    assert {state for state, _ in at_ready.values()} == {"up"}, at_ready
    assert {v for _, v in at_ready.values()} <= {"passed", "warned"}, at_ready
    assert ready.startswith("ready: new sessions are placed on all 2 nodes (node-01, node-02)")
    assert ready.endswith(f"OpenAI base URL: http://127.0.0.1:{port}/v1")
    before = seen[: seen.index(ready)]
    takes = [
        line.split(":")[0] for line in before if line.startswith("node-") and " takes " in line
    ]
    assert sorted(takes) == ["node-01 takes sessions", "node-02 takes sessions"]
    assert "not ready yet: a node takes sessions once its devices are validated" in log
    assert "Went down" not in log and "went down" not in log, log
    assert "Went down" not in stderr and "went down" not in stderr, stderr
    # the stop: Ctrl-C and SIGTERM together
    assert code == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert seen[-1] == "all processes stopped", seen
    # the control plane, the control loop and the two node agents, none left
    assert len(children) == 4 and not [p for p in children if psutil.pid_exists(p)]
