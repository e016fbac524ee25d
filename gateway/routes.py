"""The web widget's and the JSON API's routes; each delegates to the channel object built at
startup. The messaging channels mount their own (`channels.registry`)."""

from __future__ import annotations

from aiohttp import web

from gateway.keys import (
    API_CHANNEL,
    KNOWLEDGE_API,
    WEB_CHANNEL,
    WIDGET_EVENTS,
)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await request.app[WEB_CHANNEL].chat(request)


async def _chat_preflight(request: web.Request) -> web.Response:
    return await request.app[WEB_CHANNEL].preflight(request)


async def _conversation_events(request: web.Request) -> web.StreamResponse:
    return await request.app[WIDGET_EVENTS].stream(request)


async def _clear(request: web.Request) -> web.Response:
    return await request.app[WEB_CHANNEL].clear(request)


async def _feedback(request: web.Request) -> web.Response:
    return await request.app[WEB_CHANNEL].feedback(request)


async def _api_clear(request: web.Request) -> web.Response:
    return await request.app[API_CHANNEL].clear(request)


async def _turn(request: web.Request) -> web.Response:
    return await request.app[API_CHANNEL].turn(request)


async def _process(request: web.Request) -> web.Response:
    return await request.app[KNOWLEDGE_API].process(request)


async def _search(request: web.Request) -> web.Response:
    return await request.app[KNOWLEDGE_API].search(request)


# The knowledge-query contract's paths end in ":process" and ":search", which the agent's
# name must not swallow.
PIPELINE_PROCESS = "/api/v1/pipelines/{agent:[^/:]+}:process"
PIPELINE_SEARCH = "/api/v1/pipelines/{agent:[^/:]+}:search"


def channel_routes() -> list[web.RouteDef]:
    return [
        web.post("/api/v1/agents/{agent}/chat", _chat),
        web.options("/api/v1/agents/{agent}/chat", _chat_preflight),
        web.get("/api/v1/agents/{agent}/conversations/events", _conversation_events),
        web.post("/api/v1/agents/{agent}/conversations/clear", _clear),
        web.options("/api/v1/agents/{agent}/conversations/clear", _chat_preflight),
        web.post("/api/v1/agents/{agent}/feedback", _feedback),
        web.options("/api/v1/agents/{agent}/feedback", _chat_preflight),
        web.post("/api/v1/agents/{agent}/turns", _turn),
        web.delete("/api/v1/agents/{agent}/conversations/{conversation_key}", _api_clear),
        web.post(PIPELINE_PROCESS, _process),
        web.post(PIPELINE_SEARCH, _search),
    ]
