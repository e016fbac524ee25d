"""A local OpenAI-compatible server: `/v1/embeddings` (deterministic vectors)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web


def fake_vector(text: str, dimension: int) -> list[float]:
    """A stable pseudo-random unit vector per text; equal texts give equal vectors."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    vector = np.random.default_rng(seed).normal(size=dimension)
    return [float(x) for x in vector / np.linalg.norm(vector)]


@dataclass
class FakeOpenAI:
    """State of the fake: what it was asked, and failures to serve first."""

    dimension: int = 64
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Statuses to answer before succeeding, e.g. [500, 429].
    failures: list[int] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/embeddings", self._embeddings)
        return app

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(
            {"path": request.path, "body": body, "auth": request.headers.get("Authorization")}
        )
        if self.failures:
            status = self.failures.pop(0)
            error = {"error": {"message": "try again", "type": "server_error", "code": None}}
            headers = {"retry-after-ms": "10"} if status == 429 else None
            return web.json_response(error, status=status, headers=headers)
        inputs = body["input"]
        if isinstance(inputs, str):
            inputs = [inputs]
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector(text, self.dimension)}
            for i, text in enumerate(inputs)
        ]
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
            }
        )
