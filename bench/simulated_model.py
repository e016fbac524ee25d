"""A simulated chat model for measuring what the answer gates and modes change, without a
real model: it writes from the prompt's sources the way a small model does, and makes the
mistakes the gates exist for at known, seeded rates.

The writer answers with the source sentence closest to the question (by the ``encode``
given, the bundled sentence encoder in the benchmarks, and the words they share), cited as
that source's ``[n]``, and the next closest sentence of the same source when that is close
too; when no sentence is close it says it could not verify the answer. Then, per (question, attempt), it may spoil the draft:

- ``bad_citation``: cites a source the prompt does not have;
- ``invented_url``: adds a link to a page the shop does not have;
- ``broken_markdown``: leaves a ``**`` open;
- ``drift``: answers from the second-best sentence instead (often beside the question).

The critic (asked with the critic's instructions) calls an answer supported when its
sentence, citations and links stripped, is found in a source, and relevant when it shares a
word with the question.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

_SOURCE = re.compile(r'<source id="(\d+)" url="([^"]*)" title="([^"]*)">\n(.*?)\n</source>', re.S)
_WORD = re.compile(r"\w{3,}", re.UNICODE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
UNVERIFIED = "I couldn't verify this from the information on our website."
DEFECTS = ("bad_citation", "invented_url", "broken_markdown", "drift")
# Below this closeness (cosine plus a tenth per shared word) no sentence answers.
CLOSE = 0.35
Encode = Callable[[list[str]], NDArray[np.float32]]  # texts -> unit vectors, one row each


def _stems(text: str) -> set[str]:
    return {w.casefold()[:5] for w in _WORD.findall(text)}


def _draw(*parts: str) -> float:
    """A number in [0, 1) fixed by ``parts``: the same question and attempt, the same draw."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


@dataclass
class SimulatedModel:
    """``rates``: the chance of each defect in a draft (at most one per draft)."""

    encode: Encode
    rates: Mapping[str, float] = field(default_factory=dict)
    seed: str = "parley"
    drafts: int = 0
    defects: dict[str, int] = field(default_factory=dict)

    def reply(self, body: dict[str, Any]) -> str:
        messages = body.get("messages") or []
        system = _content(messages[0]) if messages else ""
        question = _content(messages[-1]) if messages else ""
        if question.startswith("Your previous answer was rejected"):
            question = question.rsplit("question: ", 1)[-1]  # the retry repeats it last
        if "critic" in str(body.get("model", "")):
            return self._criticise(system, question)
        return self._write(system, question, attempt=len(messages))

    def _ranked(self, system: str, question: str) -> list[tuple[float, int, str]]:
        """(closeness, source number, sentence), closest first."""
        found = []
        for number, _url, _title, text in _SOURCE.findall(system):
            for sentence in _SENTENCE.split(text):
                sentence = sentence.strip().lstrip("#").strip()
                if len(sentence) > 12:
                    found.append((int(number), sentence))
        if not found:
            return []
        vectors = self.encode([question, *(sentence for _, sentence in found)])
        cosines = vectors[1:] @ vectors[0]
        wanted = _stems(question)
        ranked = [
            (float(cos) + 0.1 * len(wanted & _stems(sentence)), number, sentence)
            for cos, (number, sentence) in zip(cosines, found, strict=True)
        ]
        return sorted(ranked, key=lambda r: -r[0])

    def _write(self, system: str, question: str, attempt: int) -> str:
        self.drafts += 1
        ranked = self._ranked(system, question)
        if not ranked or ranked[0][0] < CLOSE:
            return UNVERIFIED
        defect = self._defect(question, attempt)
        _, number, sentence = ranked[1] if defect == "drift" and len(ranked) > 1 else ranked[0]
        more = next(
            (s for c, n, s in ranked[1:4] if n == number and s != sentence and c >= CLOSE), None
        )
        if defect == "bad_citation":
            number += 7
        answer = f"{sentence} {more} [{number}]" if more else f"{sentence} [{number}]"
        if defect == "invented_url":
            answer += " More at https://deals.example.net/offer."
        if defect == "broken_markdown":
            answer = f"**{answer}"
        return answer

    def _defect(self, question: str, attempt: int) -> str | None:
        draw = _draw(self.seed, question, str(attempt))
        bound = 0.0
        for name in DEFECTS:
            bound += self.rates.get(name, 0.0)
            if draw < bound:
                self.defects[name] = self.defects.get(name, 0) + 1
                return name
        return None

    def _criticise(self, system: str, request: str) -> str:
        sources = " ".join(text for *_, text in _SOURCE.findall(request + system))
        answer = re.search(r"<answer>\n?(.*?)\n?</answer>", request, re.S)
        question = re.search(r"<question>\n?(.*?)\n?</question>", request, re.S)
        said = re.sub(r"\[\d+\]|https?://\S+|\*", "", answer.group(1) if answer else "").strip()
        supported = bool(said) and said.rstrip(". ") in sources
        relevant = bool(_stems(said) & _stems(question.group(1) if question else ""))
        verdict = {"relevant": relevant, "supported": supported, "drift": not relevant}
        return json.dumps({**verdict, "ok": relevant and supported})
