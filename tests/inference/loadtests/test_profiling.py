"""Flame graphs attach only to processes this array started, proved: never to whatever listens
on a node's or the control plane's port, never to a pid that now names another process."""

from __future__ import annotations

import os
import subprocess
import sys

from inference.loadtests.profiling import (
    Attested,
    Profiler,
    attest_control_plane,
    attest_node,
)
from tests.inference.loadtests.throwaway import stranger_server


def test_a_stranger_on_a_nodes_address_is_not_taken_for_the_node():
    with stranger_server() as stranger:  # this test process, without the node's credential
        why = attest_node("node-01", f"127.0.0.1:{stranger.port}")
    assert (
        why
        == f"process {os.getpid()} on 127.0.0.1:{stranger.port} is not node node-01 of this array"
    )


def test_the_control_plane_is_the_pid_its_proof_named_and_nothing_else():
    with stranger_server() as stranger:
        address = f"127.0.0.1:{stranger.port}"
        assert attest_control_plane(None, address) == (
            "the target did not prove it is this control plane"
        )
        assert "is not the one that proved it is ours" in attest_control_plane(1, address)
        attested = attest_control_plane(os.getpid(), address)
    assert isinstance(attested, Attested) and attested.pid == os.getpid() and attested.same()


def test_a_pid_that_now_names_another_process_is_not_attached_to(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    profiler = Profiler(tmp_path)
    profiler.start({"node": Attested(gone.pid, 0.0), "control_plane": "not ours"})
    assert profiler.recorders == {}
    assert profiler.results == {
        "node": {"error": f"process {gone.pid} is gone"},
        "control_plane": {"error": "not ours"},
    }
