"""Child processes that must not outlive the process that started them."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """In the child, before exec (``subprocess.Popen(preexec_fn=...)``): ask Linux to SIGTERM
    it when the thread that started it dies, even by SIGKILL (``prctl(PR_SET_PDEATHSIG)``),
    so no orphan keeps a port or a core. No-op where ``prctl`` is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
