"""The node agent's side of ``nodes.credentials``: which ``Authorization`` it accepts, and the
proof of its own identity it answers with.

A node accepts the credentials in ``$PHALANX_NODE_CREDENTIAL`` (comma-separated) and in its
credential file (one per line, ``#`` comments), re-read whenever the file changes, so a
credential can be rotated without a restart: add the new one, switch the control plane, remove
the old one (docs/node-protocol.md). A line may carry the credential's proof key after it
(``<credential> <proof key>``: what ``runnode --join`` writes); ``$PHALANX_NODE_PROOF_KEY`` is
the proof key of the environment's credentials. When a call presents a credential that has a
proof key and carries ``X-Phalanx-Challenge``, the answer gets ``X-Phalanx-Proof`` (HMAC of the
challenge under that key), which the control plane checks. Comparisons take constant time.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodes.credentials import MAX_CHALLENGE, proof_for

ENV_CREDENTIAL = "PHALANX_NODE_CREDENTIAL"
ENV_PROOF_KEY = "PHALANX_NODE_PROOF_KEY"


class NoCredential(ValueError):
    """The node was given no credential to accept, so nobody could call it."""


@dataclass(frozen=True)
class Grant:
    """A credential the node accepts, and the key it proves itself with when called with it
    (``""``: none, the node answers without a proof)."""

    credential: str
    proof_key: str = ""


class CredentialCheck:
    """Accepts ``Authorization: Bearer <credential>`` for any configured credential."""

    def __init__(
        self, *, env_value: str = "", file: Path | None = None, proof_key: str = ""
    ) -> None:
        self.fixed = tuple(
            Grant(c.strip(), proof_key.strip()) for c in env_value.split(",") if c.strip()
        )
        self.file = file
        self._file_stamp: tuple[int, int] | None = None
        self._from_file: tuple[Grant, ...] = ()
        if not self.grants():
            raise NoCredential(
                f"no node credential: set ${ENV_CREDENTIAL} or --credential-file, or join with "
                "--join and --join-token (see docs/node-protocol.md)"
            )

    @classmethod
    def from_environment(cls, file: str | None) -> CredentialCheck:
        """From ``$PHALANX_NODE_CREDENTIAL`` (with ``$PHALANX_NODE_PROOF_KEY``) and the optional
        file. Raises ``NoCredential``."""
        return cls(
            env_value=os.environ.get(ENV_CREDENTIAL, ""),
            file=Path(file) if file else None,
            proof_key=os.environ.get(ENV_PROOF_KEY, ""),
        )

    def grants(self) -> tuple[Grant, ...]:
        """Every accepted credential with its proof key (the file is re-read when its mtime or
        size changed)."""
        if self.file is not None:
            try:
                stat = self.file.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp != self._file_stamp:
                    self._from_file = parse_credential_file(self.file.read_text())
                    self._file_stamp = stamp
            except OSError:
                self._from_file, self._file_stamp = (), None
        return self.fixed + self._from_file

    def credentials(self) -> tuple[str, ...]:
        """Every accepted credential."""
        return tuple(g.credential for g in self.grants())

    def grant(self, authorization: str | None) -> Grant | None:
        """The grant ``authorization`` (``Bearer <credential>``) presents, None when refused."""
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return None
        given = presented.strip().encode()
        found = None
        # no early exit: every credential is compared, so timing tells nothing
        for grant in self.grants():
            if hmac.compare_digest(given, grant.credential.encode()):
                found = grant
        return found

    def accepts(self, authorization: str | None) -> bool:
        """True when ``authorization`` is ``Bearer <an accepted credential>``."""
        return self.grant(authorization) is not None


def parse_credential_file(text: str) -> tuple[Grant, ...]:
    """The grants of a credential file: one ``<credential> [<proof key>]`` a line, ``#``
    comments."""
    grants = []
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            grants.append(Grant(fields[0], fields[1] if len(fields) > 1 else ""))
    return tuple(grants)


Send = Callable[[dict[str, Any]], Awaitable[None]]


def proving(send: Send, grant: Grant | None, challenge: str | None) -> Send:
    """``send`` adding ``X-Phalanx-Proof`` to the response's headers when the caller presented
    a ``grant`` with a proof key and a ``challenge`` (at most ``MAX_CHALLENGE`` characters);
    ``send`` itself otherwise."""
    if grant is None or not grant.proof_key or not challenge or len(challenge) > MAX_CHALLENGE:
        return send
    proof = proof_for(grant.proof_key, challenge).encode()

    async def send_with_proof(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", []), (b"x-phalanx-proof", proof)]
            message = {**message, "headers": headers}
        await send(message)

    return send_with_proof
