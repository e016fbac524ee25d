"""The stream guard: stops answers that recite our prompt or hold no words, as they stream."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

Verdict = Literal["hold", "ok", "leak", "wordless"]

# Non-space characters to see before deciding an answer without letters or digits is junk.
WORDLESS_AFTER = 12

_WORD = re.compile(r"\w+")

REFUSALS: Mapping[str, str] = MappingProxyType(
    {
        "en": "I can't share that, but I'm happy to help with questions about our products "
        "and services.",
        "nl": "Dat kan ik niet delen, maar ik help je graag met vragen over onze producten "
        "en diensten.",
        "de": "Das kann ich nicht teilen, aber ich helfe Ihnen gern bei Fragen zu unseren "
        "Produkten und Dienstleistungen.",
        "fr": "Je ne peux pas partager cela, mais je vous aide volontiers pour toute question "
        "sur nos produits et services.",
        "es": "No puedo compartir eso, pero con gusto te ayudo con preguntas sobre nuestros "
        "productos y servicios.",
        "it": "Non posso condividerlo, ma ti aiuto volentieri con domande sui nostri prodotti "
        "e servizi.",
    }
)


def refusal(language: str | None) -> str:
    """The polite refusal in ``language`` ("nl", "nl-BE", "NL" ...), English otherwise."""
    base = (language or "en").strip().lower().replace("_", "-").split("-")[0]
    return REFUSALS.get(base, REFUSALS["en"])


def _words(text: str) -> list[str]:
    """Normalised words: casefolded, punctuation stripped (it separates words)."""
    return [word.casefold() for word in _WORD.findall(text)]


class StreamGuard:
    """Judges the answer so far each time a piece arrives; work per call is the new text only.

    A leak is any ``ngram`` consecutive words of ``secret_text`` (the fixed instructions,
    not the sources, which answers are meant to quote) appearing in the answer. Until the
    answer shows it is no recital, nothing of a possible one is shown: `releasable` says how
    much of the answer may be, which stops short of any closing run of words that is also a
    run of the instructions (and of a word still growing), so a recital is caught before its
    first word leaves.
    """

    def __init__(self, secret_text: str, *, ngram: int = 8) -> None:
        if ngram < 2:
            raise ValueError("ngram must be at least 2")
        self._ngram = ngram
        secret = _words(secret_text)
        self._secret = {tuple(secret[i : i + ngram]) for i in range(len(secret) - ngram + 1)}
        # Every shorter run of the instructions' words: the start a recital may have.
        self._runs = {
            tuple(secret[i : i + n]) for n in range(1, ngram) for i in range(len(secret) - n + 1)
        }
        self._words: list[str] = []  # complete words of the answer, normalised
        self._starts: list[int] = []  # where each of those words starts in the answer
        self._tail_start: int | None = None  # where a word still growing at the end starts
        self._consumed = 0  # answer characters turned into complete words
        self._leaked = False
        self._has_word: bool | None = None  # None until a letter, digit or enough symbols
        self._nonspace = 0
        self._scanned = 0  # answer characters counted for the word check
        self._length = 0  # of the answer last judged

    def check(self, answer_so_far: str) -> Verdict:
        """The verdict on the answer so far; call it with the whole (growing) answer."""
        if len(answer_so_far) < self._length:
            self._restart()  # not the same answer any more: judge it afresh
        self._length = len(answer_so_far)
        if self._has_word is None:
            self._judge_start(answer_so_far)
        if self._has_word is None:
            return "hold"
        if not self._has_word:
            return "wordless"
        if self._leaked or self._recites(answer_so_far):
            self._leaked = True
            return "leak"
        return "ok"

    def releasable(self, answer_so_far: str) -> int:
        """How many characters of the answer (as last judged by `check`) may be shown: all
        but a closing run of words that could begin a recital of the instructions, and a
        word still growing. Nothing while the answer is held or has leaked."""
        if self._leaked or not self._has_word:
            return 0
        held = len(answer_so_far) if self._tail_start is None else self._tail_start
        words = self._words
        for length in range(min(len(words), self._ngram - 1), 0, -1):
            if tuple(words[-length:]) in self._runs:
                return min(held, self._starts[-length])
        return held

    def _restart(self) -> None:
        self._leaked = False
        self._words = []
        self._starts = []
        self._tail_start = None
        self._consumed = 0
        self._has_word = None
        self._nonspace = 0
        self._scanned = 0

    def _judge_start(self, answer: str) -> None:
        for char in answer[self._scanned :]:
            if char.isspace():
                continue
            if char.isalnum():
                self._has_word = True
                return
            self._nonspace += 1
            if self._nonspace >= WORDLESS_AFTER:
                self._has_word = False
                return
        self._scanned = len(answer)

    def _recites(self, answer: str) -> bool:
        if not self._secret:
            return False
        offset = self._consumed
        new = answer[offset:]
        tail: str | None = None  # a word at the very end may still grow: judged, not kept
        self._tail_start = None
        for match in _WORD.finditer(new):
            if match.end() == len(new):
                tail = match.group().casefold()
                self._tail_start = offset + match.start()
                break
            self._words.append(match.group().casefold())
            self._starts.append(offset + match.start())
            if self._ends_recital(self._words):
                return True
        self._consumed = len(answer) - (len(tail) if tail is not None else 0)
        # Only the last ngram - 1 words can start a recital with words still to come.
        cut = max(0, len(self._words) - self._ngram + 1)
        del self._words[:cut]
        del self._starts[:cut]
        return tail is not None and self._ends_recital([*self._words, tail])

    def _ends_recital(self, words: list[str]) -> bool:
        return len(words) >= self._ngram and tuple(words[-self._ngram :]) in self._secret
