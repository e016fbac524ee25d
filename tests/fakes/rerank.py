"""A local `/rerank` server in TEI's format (or Jina's), scoring by a keyword of the test's choice."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeReranker:
    keyword: str
    style: str = "tei"  # or "jina"
    status: int = 200
    requests: list[dict[str, Any]] = field(default_factory=list)
    # While set and not yet released, every request waits for it (a slow reranker).
    hold: asyncio.Event | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/rerank", self._rerank)
        return app

    async def _rerank(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if self.hold is not None:
            await self.hold.wait()
        if self.status != 200:
            return web.json_response({"error": "overloaded"}, status=self.status)
        texts = body["texts"] if self.style == "tei" else body["documents"]
        scores = [0.97 if self.keyword in text else 0.02 for text in texts]
        ranked = sorted(range(len(texts)), key=lambda i: -scores[i])
        if self.style == "tei":
            return web.json_response([{"index": i, "score": scores[i]} for i in ranked])
        return web.json_response(
            {"results": [{"index": i, "relevance_score": scores[i]} for i in ranked]}
        )
