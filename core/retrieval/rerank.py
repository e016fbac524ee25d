"""A cross-encoder reranker behind an HTTP `/rerank` endpoint (TEI, Jina, Cohere formats)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import aiohttp

from core.errors import Unavailable

log = logging.getLogger(__name__)


def _scores(body: Any, count: int) -> list[float]:
    """TEI answers ``[{"index", "score"}]``; Jina and Cohere ``{"results": [{"index",
    "relevance_score"}]}``. Either way, scores come back in the order of the texts."""
    items = body.get("results") if isinstance(body, dict) else body
    if not isinstance(items, list):
        raise ValueError("unexpected rerank response")
    scores = [0.0] * count
    for item in items:
        index = int(item["index"])
        score = item.get("score", item.get("relevance_score"))
        if score is None or not 0 <= index < count:
            raise ValueError("unexpected rerank item")
        scores[index] = float(score)
    return scores


class HttpReranker:
    def __init__(self, session: aiohttp.ClientSession, url: str, timeout: float = 2.0) -> None:
        self._session = session
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def rerank(self, query: str, texts: Sequence[str]) -> list[float]:
        payload = {
            "query": query,
            "texts": list(texts),  # TEI
            "documents": list(texts),  # Jina, Cohere, Infinity
            "top_n": len(texts),
            "return_documents": False,
        }
        try:
            async with self._session.post(self._url, json=payload, timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise Unavailable(f"reranker answered HTTP {resp.status}")
                return _scores(await resp.json(), len(texts))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            raise Unavailable(f"reranker failed: {type(exc).__name__}") from exc
