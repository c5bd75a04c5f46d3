"""The proof that a load test's target is this control plane: what ``/health`` answers to a
challenge, and ``identity.prove`` refusing a stranger, a relay of the real answer, or a proof
made with another array's secret."""

from __future__ import annotations

import os
import re

import pytest

from inference.loadtests import identity
from nodes.credentials import node_secret
from tests.inference.loadtests.throwaway import stranger_server

NONCE = "0123456789abcdef" * 2


@pytest.mark.django_db
def test_health_answers_a_challenge_with_a_proof_bound_to_its_address_and_pid(client):
    body = client.get(f"/health?challenge={NONCE}").json()
    assert body["status"] == "ok" and body["identity"]["pid"] == os.getpid()
    # the test client's request arrives on testserver:80
    wanted = identity.proof(node_secret(), nonce=NONCE, host="testserver", port=80, pid=os.getpid())
    assert body["identity"]["proof"] == wanted
    assert client.get("/health").json() == {"status": "ok"}
    for odd in ("xyz", "ab" * 40, "ABCDEF" * 6, ""):
        assert "identity" not in client.get("/health", {"challenge": odd}).json(), odd


def _answering(proof_for):
    """A server whose ``/health`` gives ``proof_for(nonce, port)`` as its proof (pid 4242)."""

    def answer(path, stranger):
        found = re.search(r"challenge=([0-9a-f]+)", path)
        if not path.startswith("/health") or not found:
            return 404, {}
        proof = proof_for(found.group(1), stranger.port)
        return 200, {"status": "ok", "identity": {"pid": 4242, "proof": proof}}

    return answer


def test_it_accepts_a_proof_for_the_address_it_connected_to():
    secret = node_secret()
    good = _answering(
        lambda n, port: identity.proof(secret, nonce=n, host="127.0.0.1", port=port, pid=4242)
    )
    with stranger_server(good) as server:
        proven = identity.prove(server.url)
    assert proven == identity.Proven(pid=4242, address=("127.0.0.1", server.port))
    assert server.credentials() == []  # the challenge carries no credential


@pytest.mark.parametrize(
    "proof_for",
    [
        # a relay: the real control plane's answer, made for its own port
        lambda n, port: identity.proof(
            node_secret(), nonce=n, host="127.0.0.1", port=8000, pid=4242
        ),
        # another array's secret
        lambda n, port: identity.proof("other", nonce=n, host="127.0.0.1", port=port, pid=4242),
        # an old answer replayed (another nonce)
        lambda n, port: identity.proof(
            node_secret(), nonce=NONCE, host="127.0.0.1", port=port, pid=4242
        ),
    ],
    ids=["relayed", "other-array", "replayed"],
)
def test_it_refuses_a_proof_that_does_not_match(proof_for):
    with stranger_server(_answering(proof_for)) as server:
        with pytest.raises(identity.NotThisControlPlane) as caught:
            identity.prove(server.url)
    assert "does not match this array's secret" in str(caught.value)


def test_it_refuses_a_target_that_only_says_ok():
    with stranger_server() as server:
        with pytest.raises(identity.NotThisControlPlane) as caught:
            identity.prove(server.url)
    assert "gave no proof that it is this control plane (HTTP 200)" in str(caught.value)
    with pytest.raises(identity.NotThisControlPlane) as caught:
        identity.prove(server.url)  # now nobody listens there
    assert "did not answer" in str(caught.value)
