"""The channels' HTTP routes; each delegates to the channel object built at startup."""

from __future__ import annotations

from aiohttp import web

from gateway.keys import (
    API_CHANNEL,
    TELEGRAM_CHANNEL,
    TWILIO_CHANNEL,
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


async def _api_clear(request: web.Request) -> web.Response:
    return await request.app[API_CHANNEL].clear(request)


async def _turn(request: web.Request) -> web.Response:
    return await request.app[API_CHANNEL].turn(request)


async def _twilio(request: web.Request) -> web.Response:
    return await request.app[TWILIO_CHANNEL].webhook(request)


async def _twilio_status(request: web.Request) -> web.Response:
    return await request.app[TWILIO_CHANNEL].status(request)


async def _telegram(request: web.Request) -> web.Response:
    return await request.app[TELEGRAM_CHANNEL].webhook(request)


def channel_routes() -> list[web.RouteDef]:
    return [
        web.post("/api/v1/agents/{agent}/chat", _chat),
        web.options("/api/v1/agents/{agent}/chat", _chat_preflight),
        web.get("/api/v1/agents/{agent}/conversations/events", _conversation_events),
        web.post("/api/v1/agents/{agent}/conversations/clear", _clear),
        web.options("/api/v1/agents/{agent}/conversations/clear", _chat_preflight),
        web.post("/api/v1/agents/{agent}/turns", _turn),
        web.delete("/api/v1/agents/{agent}/conversations/{conversation_key}", _api_clear),
        # Before the agent route, or an agent named "status" would shadow it.
        web.post("/webhooks/twilio/status", _twilio_status),
        web.post("/webhooks/twilio/{agent}", _twilio),
        web.post("/webhooks/telegram/{agent}", _telegram),
    ]
