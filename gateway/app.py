"""The application factory: settings in, a ready-to-run aiohttp application out."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from channels.api import ApiChannel
from channels.telegram import TelegramChannel
from channels.twilio import TwilioChannel
from channels.web import WebChannel
from channels.web_events import WidgetEvents
from core.answer.factory import build_pipeline
from core.answer.question import load_language_models
from core.cache import open_cache
from core.handoff import ConversationFeed, Handoff
from core.llm.limits import ModelLimits
from core.llm.openai_chat import close_chat_model, open_chat_model
from core.retrieval.embedders import EmbedderIdentity, close_embedder, open_embedder
from core.settings import Settings
from core.store import Agents, open_database
from core.store.api_keys import ApiKeys
from core.store.inbox import Inbox
from core.store.outbox import Outbox
from core.store.vector_index import check_embedders
from gateway import health, routes
from gateway.admin.setup import setup_admin
from gateway.client_address import PROXY_TRUST, ProxyTrust, client_address
from gateway.demo import DemoSite, demo_routes, widget_routes
from gateway.durable import reply_splitters
from gateway.keys import (
    API_CHANNEL,
    CACHE,
    CONVERSATION_FEED,
    DATABASE,
    EMBEDDER,
    HANDOFF,
    HTTP,
    METRICS,
    MODEL_LIMITS,
    SETTINGS,
    TELEGRAM_CHANNEL,
    TWILIO_CHANNEL,
    WEB_CHANNEL,
    WIDGET_EVENTS,
)
from gateway.metrics import HttpMetrics
from gateway.middlewares import body_deadline, errors, metrics, request_context
from gateway.runtime import HTTP_TIMEOUT, Runtime
from gateway.worker import start_services, stop_services

log = logging.getLogger(__name__)

# Largest request body accepted (webhooks and chat messages are far smaller).
MAX_BODY_BYTES = 1024 * 1024
# How long turns still streaming at shutdown get to finish and be saved.
TURN_DRAIN_SECONDS = 10.0
# Then summaries still being written get this long; the catch-up job does the rest.
SUMMARY_DRAIN_SECONDS = 5.0
# Agents are looked up on every turn; a changed setting applies within this many seconds.
AGENT_FRESH_SECONDS = 5.0
# Connections for the gateway: a turn may hold two at once (vector and full-text search).
POOL_SIZE = 20


async def _embedder(app: web.Application) -> AsyncIterator[None]:
    embedder = await open_embedder(app[SETTINGS])
    await asyncio.to_thread(load_language_models)
    app[EMBEDDER] = embedder
    yield
    await close_embedder(embedder)


async def _database(app: web.Application) -> AsyncIterator[None]:
    database = await open_database(app[SETTINGS], max_size=POOL_SIZE)
    try:
        async with database.pool.acquire() as conn:
            await check_embedders(conn, EmbedderIdentity.of(app[EMBEDDER]))
        app[DATABASE] = database
        yield
    finally:
        await database.close()


async def _cache(app: web.Application) -> AsyncIterator[None]:
    cache = await open_cache(app[SETTINGS])
    app[CACHE] = cache
    yield
    await cache.close()


async def _http_session(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
        app[HTTP] = session
        yield


async def _handoff(app: web.Application) -> AsyncIterator[None]:
    """The feed that brings staff replies to open widgets, from whichever gateway process."""
    database = app[DATABASE]
    feed = ConversationFeed(database.pool, database.url)
    await feed.start()
    app[CONVERSATION_FEED] = feed
    yield
    await feed.close()


async def _end_streams(app: web.Application) -> None:
    # Before the server waits for open requests: live widget streams would never finish.
    await app[CONVERSATION_FEED].close()


async def _channels(app: web.Application) -> AsyncIterator[None]:
    """The answer pipeline and the HTTP channels that hand turns to it."""
    settings = app[SETTINGS]
    pool = app[DATABASE].pool
    chat = open_chat_model(settings)
    agents = Agents(pool, fresh_for=AGENT_FRESH_SECONDS)
    pipeline = build_pipeline(
        settings,
        pool,
        app[CACHE],
        app[EMBEDDER],
        app[HTTP],
        chat,
        agents,
        limits=app[MODEL_LIMITS],
    )
    app[WEB_CHANNEL] = WebChannel(
        pipeline, agents, app[CACHE], settings.public_url, client_address=client_address
    )
    app[API_CHANNEL] = ApiChannel(pipeline, agents, ApiKeys(pool))
    app[WIDGET_EVENTS] = WidgetEvents(app[WEB_CHANNEL], agents, app[CACHE], app[CONVERSATION_FEED])
    app[HANDOFF] = Handoff(pool, splitters=reply_splitters(), memory=pipeline.memory)
    inbox = Inbox(pool)
    app[TWILIO_CHANNEL] = TwilioChannel(agents, inbox, Outbox(pool), settings)
    app[TELEGRAM_CHANNEL] = TelegramChannel(agents, inbox, settings)
    log.info("gateway.answering mode=%s", "llm" if chat else "extractive")
    yield
    await app[WEB_CHANNEL].drain(within=TURN_DRAIN_SECONDS)
    await pipeline.memory.drain(within=SUMMARY_DRAIN_SECONDS)
    if chat is not None:
        await close_chat_model(chat)


async def _services(app: web.Application) -> AsyncIterator[None]:
    """The messaging workers, in-process, sharing the gateway's pool, cache and embedder."""
    runtime = Runtime(
        app[SETTINGS], app[DATABASE], app[CACHE], app[EMBEDDER], app[HTTP], app[MODEL_LIMITS]
    )
    tasks = start_services(runtime)
    yield
    await stop_services(tasks)


async def _announce(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    # Everything loaded at startup (libraries, the embedder, settings) lives until the end:
    # frozen, the collector's full passes skip it instead of pausing requests to walk it.
    gc.collect()
    gc.freeze()
    log.info("gateway.started host=%s port=%d", settings.host, settings.port)
    yield
    log.info("gateway.stopping")


def create_app(
    settings: Settings, demo: DemoSite | None = None, *, background: bool = False
) -> web.Application:
    """Build the gateway; resources open on startup and close on cleanup, in reverse order.

    With ``demo``, the sample shop's pages are served at / with the widget on every page;
    with ``background``, the messaging workers run in this process too (`parley serve`).
    """
    app = web.Application(
        middlewares=[body_deadline(settings.body_read_seconds), request_context, metrics, errors],
        client_max_size=MAX_BODY_BYTES,
        # Also bounds how long a request's headers may take (README: "Behind a proxy").
        handler_args={"keepalive_timeout": settings.keepalive_seconds},
    )
    app[PROXY_TRUST] = ProxyTrust.of(settings)
    app[SETTINGS] = settings
    app[METRICS] = HttpMetrics()
    app[MODEL_LIMITS] = ModelLimits()
    app.cleanup_ctx.extend([_embedder, _database, _cache, _http_session, _handoff, _channels])
    app.on_shutdown.append(_end_streams)
    setup_admin(app)
    if background:
        app.cleanup_ctx.append(_services)
    app.cleanup_ctx.append(_announce)
    app.add_routes(health.routes)
    app.add_routes(routes.channel_routes())
    app.add_routes(widget_routes())
    if demo is not None:
        app.add_routes(demo_routes(demo.site_dir, demo.agent, demo.widget_key))
    return app
