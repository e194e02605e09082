"""Text from token ids as they come: incremental detokenisation with stop strings.

``Detokenizer`` decodes a short window of trailing ids per token (as vLLM does), never the
whole answer, and holds text back while it ends in U+FFFD (half a character). ``TextStream``
holds back text that could begin a stop string until the next token decides."""

from __future__ import annotations

from typing import Sequence

__all__ = ["Detokenizer", "TextStream"]

INCOMPLETE = "\ufffd"  # what a decoder gives for bytes that do not form a character (yet)


class Detokenizer:
    """Text deltas for ids pushed one at a time; with ``flush`` they add up to one decode of all."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._start = 0  # first id of the decode window
        self._released = 0  # ids whose text has been released
        self._start_text = ""  # decode(ids[_start:_released]), the window's already-released part

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def push(self, token: int) -> str:
        """Add an id; the newly complete text (may be empty)."""
        self.ids.append(int(token))
        text = self._decode(self.ids[self._start:])
        if len(text) <= len(self._start_text) or text.endswith(INCOMPLETE):
            return ""  # nothing new yet (a skipped special token, half a character)
        return self._advance(text)

    def flush(self) -> str:
        """The text still held."""
        if self._released == len(self.ids):
            return ""
        text = self._decode(self.ids[self._start:])
        return self._advance(text) if len(text) > len(self._start_text) else ""

    def _advance(self, text: str) -> str:
        delta = text[len(self._start_text):]
        self._start, self._released = self._released, len(self.ids)
        self._start_text = self._decode(self.ids[self._start:self._released])
        return delta


class TextStream:
    """Incremental text with stop strings: stops at the earliest one (text ends just before it);
    released pieces always add up to ``text``."""

    def __init__(self, tokenizer, stop: Sequence[str]):
        self.stop = [s for s in stop if s]
        self.detokenizer = None if tokenizer is None else Detokenizer(tokenizer)
        self._pieces: list[str] = []  # released text, piece by piece
        self._held = ""  # decoded text not released yet: a possible start of a stop string
        self.stopped = False

    @property
    def text(self) -> str:
        """The text released so far."""
        return "".join(self._pieces)

    def push(self, token: int) -> str:
        """Add a token; the newly released text piece."""
        if self.detokenizer is None or self.stopped:
            return ""
        return self._release(self.detokenizer.push(token), final=False)

    def finish(self) -> str:
        """Release what is still held (nothing after a stop string)."""
        if self.detokenizer is None or self.stopped:
            return ""
        return self._release(self.detokenizer.flush(), final=True)

    def _release(self, delta: str, *, final: bool) -> str:
        # a stop string cannot begin in released text (that text was held while it could), so
        # the held text plus the new delta is all there is to search
        pending = self._held + delta
        found = [at for s in self.stop if (at := pending.find(s)) >= 0]
        if found:
            self.stopped = True
            piece, self._held = pending[: min(found)], ""
        else:
            keep = 0 if final else self._stop_prefix(pending)
            piece, self._held = pending[: len(pending) - keep], pending[len(pending) - keep:]
        if piece:
            self._pieces.append(piece)
        return piece

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:k]):
                    longest = k
                    break
        return longest
