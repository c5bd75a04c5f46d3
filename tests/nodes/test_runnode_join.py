"""``runnode --join``'s steps before the model loads (``join_if_asked``): what it sends, where
the credential goes, and what it refuses (docs/node-protocol.md, "Joining from another host")."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from nodes.agent import joining as agent_joining
from nodes.management.commands import runnode


def options(tmp_path, **extra) -> dict:
    base = {
        "join": "http://198.18.0.1:8000",
        "join_token": "phxj_t",
        "join_ca": None,
        "id": "node-07",
        "listen": "198.18.0.2:9401",
        "advertise": None,
        "package": None,
        "credential_file": str(tmp_path / "node.credential"),
        "array_id": "",
    }
    return {**base, **extra}


@pytest.fixture
def joins(monkeypatch) -> list[dict]:
    calls: list[dict] = []

    def join_array(url, **kwargs):
        calls.append({"url": url, **kwargs})
        return agent_joining.Joined("phx2.c", "pk", "a" * 16)

    monkeypatch.setattr(runnode, "join_array", join_array)
    return calls


def test_it_joins_then_keeps_the_credential_and_the_array_id(tmp_path, joins) -> None:
    o = options(tmp_path, listen="0.0.0.0:9401", advertise="198.18.0.2:9401")
    runnode.join_if_asked(o, lambda line: None)
    assert joins[0]["address"] == "198.18.0.2:9401" and joins[0]["token"] == "phxj_t"
    assert (tmp_path / "node.credential").read_text().count("phx2.c pk") == 1
    assert o["array_id"] == "a" * 16


def test_it_needs_an_address_the_control_plane_can_reach(tmp_path, joins) -> None:
    with pytest.raises(CommandError, match="--advertise"):
        runnode.join_if_asked(options(tmp_path, listen="0.0.0.0:9401"), print)
    assert not joins


def test_it_needs_a_token_to_join(tmp_path, joins, monkeypatch) -> None:
    monkeypatch.delenv(agent_joining.ENV_JOIN_TOKEN, raising=False)
    with pytest.raises(CommandError, match="--join-token"):
        runnode.join_if_asked(options(tmp_path, join_token=None), print)


def test_it_says_why_the_control_plane_refused(tmp_path, monkeypatch) -> None:
    def refused(url, **kwargs):
        raise agent_joining.JoinFailed("the control plane refused the join (403: expired)")

    monkeypatch.setattr(runnode, "join_array", refused)
    with pytest.raises(CommandError, match="403: expired"):
        runnode.join_if_asked(options(tmp_path), print)
    assert not (tmp_path / "node.credential").exists()


def test_a_restart_does_not_join_again_unless_revoked(tmp_path, joins, monkeypatch) -> None:
    agent_joining.write_credential_file(
        tmp_path / "node.credential", agent_joining.Joined("phx2.c", "pk", "")
    )
    monkeypatch.setattr(runnode, "still_registered", lambda *a, **k: "")
    runnode.join_if_asked(options(tmp_path), lambda line: None)
    assert not joins
    monkeypatch.setattr(runnode, "still_registered", lambda *a, **k: "401: revoked")
    with pytest.raises(CommandError, match="revoked"):
        runnode.join_if_asked(options(tmp_path), print)
