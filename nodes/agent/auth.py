"""The node agent's side of ``nodes.credentials``: which ``Authorization`` it accepts.

A node accepts the credentials in ``$PHALANX_NODE_CREDENTIAL`` (comma-separated) and in its
credential file (one per line, ``#`` comments), re-read whenever the file changes, so a
credential can be rotated without a restart: add the new one, switch the control plane, remove
the old one (docs/node-protocol.md). Comparisons take constant time.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

ENV_CREDENTIAL = "PHALANX_NODE_CREDENTIAL"


class NoCredential(ValueError):
    """The node was given no credential to accept, so nobody could call it."""


class CredentialCheck:
    """Accepts ``Authorization: Bearer <credential>`` for any configured credential."""

    def __init__(self, *, env_value: str = "", file: Path | None = None) -> None:
        self.fixed = tuple(c.strip() for c in env_value.split(",") if c.strip())
        self.file = file
        self._file_stamp: tuple[int, int] | None = None
        self._from_file: tuple[str, ...] = ()
        if not self.credentials():
            raise NoCredential(
                f"no node credential: set ${ENV_CREDENTIAL} or --credential-file "
                "(`manage.py nodecredential --id <node>` prints one; see docs/node-protocol.md)"
            )

    @classmethod
    def from_environment(cls, file: str | None) -> CredentialCheck:
        """From ``$PHALANX_NODE_CREDENTIAL`` and the optional file. Raises ``NoCredential``."""
        return cls(env_value=os.environ.get(ENV_CREDENTIAL, ""), file=Path(file) if file else None)

    def credentials(self) -> tuple[str, ...]:
        """Every accepted credential (the file is re-read when its mtime or size changed)."""
        if self.file is not None:
            try:
                stat = self.file.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp != self._file_stamp:
                    self._from_file = _parse(self.file.read_text())
                    self._file_stamp = stamp
            except OSError:
                self._from_file, self._file_stamp = (), None
        return self.fixed + self._from_file

    def accepts(self, authorization: str | None) -> bool:
        """True when ``authorization`` is ``Bearer <an accepted credential>``."""
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return False
        given = presented.strip().encode()
        # no early exit: every credential is compared, so timing tells nothing
        matches = [hmac.compare_digest(given, c.encode()) for c in self.credentials()]
        return any(matches)


def _parse(text: str) -> tuple[str, ...]:
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return tuple(line for line in lines if line)
