"""Writing behind: work queued on the hot path, written by one thread a little later.

``WriteBehind(write, delay_s, name)`` runs ``write()`` in its own writer thread at most
``delay_s`` seconds after the first ``soon()`` since the last run (later calls within that
time join the same run), and at once with ``now()``, which waits for it. At interpreter exit
the writer thread has already stopped (``concurrent.futures`` joins it before ``atexit``
handlers run): ``now()`` then runs ``write()`` in the calling thread, so an exit handler still
writes. Used by the usage recorder and the embedded array's rate-limit counts.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class WriteBehind:
    def __init__(self, write: Callable[[], None], delay_s: float, name: str) -> None:
        self._write = write
        self._delay_s = delay_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def soon(self) -> None:
        """Run ``write`` within ``delay_s`` (one run for every call until it starts)."""
        with self._lock:
            if self._timer is not None:
                return
            self._timer = threading.Timer(self._delay_s, self._submit)
            self._timer.daemon = True
            self._timer.start()

    def _submit(self) -> None:
        with contextlib.suppress(RuntimeError):  # exiting: the exit handler writes
            self._executor.submit(self._run)

    def _run(self) -> None:
        with self._lock:
            self._timer = None  # what is queued from now on needs another run
        self._write()

    def now(self, timeout: float = 10.0) -> None:
        """Run ``write`` in the writer thread and wait for it (the calling thread at exit)."""
        try:
            done = self._executor.submit(self._run)
        except RuntimeError:  # cannot schedule new futures after shutdown
            self._run()
            return
        done.result(timeout=timeout)

    def cancel(self) -> None:
        """Drop a run that ``soon`` scheduled and has not started (tests)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
