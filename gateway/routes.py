"""The channels' HTTP routes; each delegates to the channel object built at startup."""

from __future__ import annotations

from aiohttp import web

from gateway.keys import API_CHANNEL, WEB_CHANNEL


async def _chat(request: web.Request) -> web.StreamResponse:
    return await request.app[WEB_CHANNEL].chat(request)


async def _chat_preflight(request: web.Request) -> web.Response:
    return await request.app[WEB_CHANNEL].preflight(request)


async def _turn(request: web.Request) -> web.Response:
    return await request.app[API_CHANNEL].turn(request)


def channel_routes() -> list[web.RouteDef]:
    return [
        web.post("/api/v1/agents/{agent}/chat", _chat),
        web.options("/api/v1/agents/{agent}/chat", _chat_preflight),
        web.post("/api/v1/agents/{agent}/turns", _turn),
    ]
