"""Query rewrite: a follow-up ("and the blue one?") becomes a self-contained search query.

Only the search uses the rewrite; the prompt always gets the visitor's own words.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from core.errors import Unavailable
from core.ports import Cache, ChatMessage, ChatModel

log = logging.getLogger(__name__)

CACHE_TTL = 2 * 60 * 60
MAX_TOKENS = 60
SHORT_QUESTION_WORDS = 5

# Openings and words that lean on what was said before, in en / nl / de / fr.
_FOLLOW_UP_START = re.compile(
    r"^\s*(and|but|also|what about|how about|so|then|en|maar|ook|en wat|und|aber|auch|"
    r"und was|et|mais|aussi|et pour)\b",
    re.IGNORECASE,
)
_ANAPHORA = re.compile(
    r"\b(it|its|that|this|these|those|they|them|one|ones|het|dat|die|deze|dit|ze|hem|"
    r"es|das|dieser|diese|davon|dafür|ça|cela|celui|celle|ceux|le|la|les)\b",
    re.IGNORECASE,
)

REWRITE_INSTRUCTIONS = (
    "Rewrite the visitor's last message as one self-contained search query for the shop's "
    "website, in the language of that message. Fill in what it refers to from the "
    "conversation (product names, topics, countries). Output only the query, nothing else."
)

Method = Literal["verbatim", "llm", "cached", "heuristic"]


@dataclass(frozen=True, slots=True)
class Rewrite:
    query: str
    method: Method
    ms: float = 0.0
    reason: str | None = None  # why the heuristic was used


def is_follow_up(question: str, history: Sequence[tuple[str, str]]) -> bool:
    """A question that needs the conversation to be understood (never the first turn)."""
    if not any(role == "visitor" for role, _ in history):
        return False
    words = re.findall(r"\w+", question)
    return (
        len(words) <= SHORT_QUESTION_WORDS
        or bool(_FOLLOW_UP_START.search(question))
        or bool(_ANAPHORA.search(question))
    )


def heuristic_rewrite(question: str, history: Sequence[tuple[str, str]]) -> str:
    """Deterministic fallback: the previous visitor message gives the topic."""
    previous = next((text for role, text in reversed(history) if role == "visitor"), "")
    return f"{previous} {question}".strip()


class QueryRewriter:
    def __init__(
        self, chat: ChatModel | None, cache: Cache, *, model: str | None, timeout_ms: int
    ) -> None:
        self._chat = chat
        self._cache = cache
        self._model = model
        self._timeout = timeout_ms / 1000

    async def rewrite(
        self,
        scope: str,
        question: str,
        history: Sequence[tuple[str, str]],
        *,
        summary: str | None = None,
    ) -> Rewrite:
        """``scope`` names the conversation (agent and key) for the cache; ``summary`` is what
        the conversation said before ``history``, for a topic named only long ago."""
        if not is_follow_up(question, history):
            return Rewrite(question, "verbatim")
        started = time.perf_counter()
        recent = history[-6:]
        digest = hashlib.sha256(repr((summary, recent, question)).encode()).hexdigest()[:24]
        key = f"rewrite:{scope}:{digest}"
        cached = await self._cache.get(key)
        if cached:
            return Rewrite(cached, "cached", _ms(started))
        if self._chat is None:
            return Rewrite(heuristic_rewrite(question, history), "heuristic", 0.0, "no_llm")
        transcript = "\n".join(f"{role}: {text}" for role, text in recent)
        if summary:
            transcript = f"(earlier: {summary})\n{transcript}"
        try:
            text = await self._chat.complete(
                [
                    ChatMessage("system", REWRITE_INSTRUCTIONS),
                    ChatMessage("user", f"Conversation:\n{transcript}\n\nLast message: {question}"),
                ],
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                model=self._model,
                timeout=self._timeout,
            )
        except Unavailable as exc:
            reason = "timeout" if "timeout" in exc.message.lower() else "error"
            log.info("rewrite.fallback reason=%s", reason)
            return Rewrite(heuristic_rewrite(question, history), "heuristic", _ms(started), reason)
        query = " ".join(text.strip().strip('"').split())
        if not query:
            return Rewrite(heuristic_rewrite(question, history), "heuristic", _ms(started), "empty")
        await self._cache.set(key, query, ttl=CACHE_TTL)
        return Rewrite(query, "llm", _ms(started))


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 2)
