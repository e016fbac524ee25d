"""A reasoning model's thinking, kept out of its answer: `<think>` and `<thinking>` blocks in
the text (DeepSeek-R1, Qwen3 and others served without a reasoning parser), and how long the
model thought, whether it wrote its thoughts inline or in `reasoning_content` (vLLM, llama.cpp
with a reasoning format, DeepSeek's API)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

_OPEN = re.compile(r"<(think|thinking)>", re.IGNORECASE)
_CLOSE = {"think": re.compile(r"</think>", re.IGNORECASE),
          "thinking": re.compile(r"</thinking>", re.IGNORECASE)}  # fmt: skip
# The longest tag: a piece ending in a part of one is held until the next piece.
_LONGEST_TAG = len("</thinking>")


class Thoughts:
    """Takes a reply's text as it streams and gives back what is not thinking.

    Thinking inside a block is dropped; a block opened and never closed hides the rest of the
    reply (the model ran out of tokens while thinking). A tag split across two pieces is
    recognised: the end of a piece that may be the start of a tag waits for the next."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pending = ""  # text not yet judged (may hold the start of a tag)
        self._inside: str | None = None  # the open block's tag name
        self._started: float | None = None  # when the first thinking arrived
        self._ended: float | None = None  # when the last thinking arrived
        self._trim = False  # the space after a closed block is no part of the answer

    @property
    def thinking(self) -> bool:
        return self._inside is not None

    @property
    def seconds(self) -> float | None:
        """How long the model thought (first to last thought), None if it never did."""
        if self._started is None:
            return None
        return round((self._ended or self._clock()) - self._started, 3)

    def thought(self) -> None:
        """The model sent thinking by a channel of its own (``reasoning_content``)."""
        now = self._clock()
        if self._started is None:
            self._started = now
        self._ended = now

    def feed(self, text: str) -> str:
        """The visible part of the reply's next piece ``text`` (possibly "")."""
        self._pending += text
        visible: list[str] = []
        while self._pending:
            if self._inside is not None:
                self.thought()
                closing = _CLOSE[self._inside].search(self._pending)
                if closing is None:
                    # keep only what may be the start of the closing tag
                    self._pending = self._pending[-_LONGEST_TAG:]
                    break
                self._pending = self._pending[closing.end() :]
                self._inside = None
                self._trim = True
                continue
            opening = _OPEN.search(self._pending)
            if opening is not None:
                visible.append(self._pending[: opening.start()])
                self._inside = opening.group(1).lower()
                self._pending = self._pending[opening.end() :]
                self.thought()
                continue
            cut = self._pending.rfind("<")
            if (
                cut >= 0
                and len(self._pending) - cut < _LONGEST_TAG
                and ">" not in self._pending[cut:]
            ):
                visible.append(self._pending[:cut])  # "<thi" may become "<think>"
                self._pending = self._pending[cut:]
            else:
                visible.append(self._pending)
                self._pending = ""
            break
        shown = "".join(visible)
        if self._trim:
            shown = shown.lstrip()
            self._trim = not shown
        return shown

    def end(self) -> str:
        """What is left once the reply has ended: a held "<" that began no tag."""
        rest, self._pending = ("" if self._inside else self._pending), ""
        return rest


def without_thoughts(text: str) -> str:
    """A whole reply without its thinking blocks."""
    thoughts = Thoughts()
    return (thoughts.feed(text) + thoughts.end()).strip()
