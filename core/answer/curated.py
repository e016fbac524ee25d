"""Curated answers: a trigger (keyword, pattern or a close question) short-circuits the turn."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from core.patterns import cached_pattern
from core.ports import Embedder
from core.store.curated import CuratedAnswer

log = logging.getLogger(__name__)

# With the bundled encoder a paraphrase ("Where can I find your store?" for "Where is your
# shop located?", or its Dutch translation) scores about 0.73, a different question about
# the same topic ("Where is my order?") about 0.5.
QUESTION_SIMILARITY = 0.7


def _has_phrase(text: str, phrase: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(phrase.casefold())}(?!\w)", text.casefold()) is not None


def _pattern_matches(pattern: str, text: str) -> bool:
    # RE2, never re: a staff pattern must not be able to hold the event loop (see
    # core/patterns.py); one saved before patterns were checked with RE2 is skipped.
    compiled = cached_pattern(pattern)
    if compiled is None:
        log.warning("curated.pattern.invalid pattern=%r", pattern)
        return False
    return compiled.search(text)


# Curated questions change rarely and are asked about on every turn: embed each text once.
_QUESTION_VECTORS: dict[tuple[str, str], NDArray[np.float32]] = {}
_MAX_REMEMBERED = 10_000


async def _question_vectors(texts: Sequence[str], embedder: Embedder) -> NDArray[np.float32]:
    missing = [t for t in dict.fromkeys(texts) if (embedder.name, t) not in _QUESTION_VECTORS]
    if missing:
        if len(_QUESTION_VECTORS) + len(missing) > _MAX_REMEMBERED:
            _QUESTION_VECTORS.clear()
        for text, vector in zip(missing, await embedder.embed(missing), strict=True):
            _QUESTION_VECTORS[(embedder.name, text)] = vector
    return np.vstack([_QUESTION_VECTORS[(embedder.name, t)] for t in texts])


async def match_curated(
    question: str,
    question_vector: NDArray[np.float32] | None,
    answers: Sequence[CuratedAnswer],
    embedder: Embedder,
) -> CuratedAnswer | None:
    """The first answer whose keyword or pattern occurs, else the closest question above the
    bar. Keywords and patterns are exact tools staff chose, so they win over similarity."""
    for answer in answers:
        if any(_has_phrase(question, k) for k in answer.keywords if k.strip()):
            return answer
        if answer.pattern and _pattern_matches(answer.pattern, question):
            return answer
    with_questions = [a for a in answers if a.question.strip()]
    if not with_questions:
        return None
    vectors = await _question_vectors([a.question for a in with_questions], embedder)
    if question_vector is None:
        question_vector = (await embedder.embed([question]))[0]
    similarities = vectors @ question_vector
    best = int(np.argmax(similarities))
    if float(similarities[best]) >= QUESTION_SIMILARITY:
        return with_questions[best]
    return None
