"""Incremental text assembly for a token stream: UTF-8-safe detokenization and stop strings.

A token's piece is a byte string that may end in the middle of a UTF-8 character (emoji, CJK,
accents split across tokens). ``TextAssembler`` feeds pieces through an incremental UTF-8
decoder, so it never emits half a character, and holds back any tail that could still grow into
a stop string, so the streamed deltas concatenate to exactly the non-streamed text.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field


def _longest_partial_stop(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:size]):
                best = size
                break
    return best


@dataclass
class TextAssembler:
    """Turns token pieces (bytes) into text deltas, honouring stop strings.

    ``push(piece)`` returns the text that is now safe to emit ("" when it must wait for more
    bytes). ``stopped`` becomes true once a stop string appears; the stop string itself and
    everything after it are never emitted. ``finish()`` flushes what was held back.
    """

    stops: tuple[str, ...] = ()
    text: str = ""
    stopped: bool = False
    _emitted: int = 0
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )

    def push(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        self.text += self._decoder.decode(piece)
        return self._release(final=False)

    def finish(self) -> str:
        """Flush held-back text. Bytes of a character cut off by max_tokens are dropped."""
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        cut = self._find_stop()
        if cut is not None:
            self.stopped = True
            self.text = self.text[:cut]
            end = cut
        elif final:
            end = len(self.text)
        else:
            end = len(self.text) - _longest_partial_stop(self.text[self._emitted :], self.stops)
        if end <= self._emitted:
            return ""
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta

    def _find_stop(self) -> int | None:
        # A stop string can only start in the not-yet-emitted tail (held back above).
        positions = [self.text.find(s, self._emitted) for s in self.stops if s]
        found = [p for p in positions if p >= 0]
        return min(found) if found else None
