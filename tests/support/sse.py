"""Reading the gateway's SSE streams the way a client does, with httpx and httpx-sse."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import aconnect_sse


@dataclass
class Stream:
    status: int
    headers: httpx.Headers
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    def data(self, kind: str) -> dict[str, Any]:
        return next(data for k, data in self.events if k == kind)

    def text(self) -> str:
        return "".join(d["text"] for k, d in self.events if k == "token")


async def chat(
    base_url: str,
    agent: str,
    message: str,
    *,
    key: str,
    session_id: str = "session-0001",
    origin: str | None = None,
    headers: dict[str, str] | None = None,
    **body: Any,
) -> Stream:
    headers = {"X-Parley-Key": key, **(headers or {})}
    if origin:
        headers["Origin"] = origin
    payload = {"message": message, "session_id": session_id, **body}
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=60) as client,
        aconnect_sse(
            client, "POST", f"/api/v1/agents/{agent}/chat", json=payload, headers=headers
        ) as source,
    ):
        stream = Stream(source.response.status_code, source.response.headers)
        if source.response.headers.get("content-type", "").startswith("text/event-stream"):
            async for event in source.aiter_sse():
                stream.events.append((event.event, json.loads(event.data)))
        else:
            await source.response.aread()
            stream.events.append(("http_error", source.response.json()))
        return stream
