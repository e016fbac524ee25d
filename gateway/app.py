"""The application factory: settings in, a ready-to-run aiohttp application out."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from channels.api import ApiChannel
from channels.base import ChannelContext
from channels.knowledge_api import KnowledgeApi
from channels.registry import BY_NAME, CHANNELS
from channels.web import WebChannel
from channels.web_events import WidgetEvents
from core.answer.question import load_language_models
from core.handoff import ConversationFeed, Handoff
from core.jobs.turn_time import longest_turn
from core.llm.probe import ModelWatch, open_model_server
from core.settings import Settings
from core.store.api_keys import ApiKeys
from core.store.feedback import Feedback
from core.store.inbox import Inbox
from core.store.outbox import Outbox
from gateway import health, routes
from gateway.admin.setup import setup_admin
from gateway.client_address import PROXY_TRUST, ProxyTrust, client_address, subscriber
from gateway.demo import DemoSite, demo_routes, widget_routes
from gateway.keys import (
    ANSWERING,
    API_CHANNEL,
    CACHE,
    CHANNEL_CONTEXT,
    CONVERSATION_FEED,
    DATABASE,
    EMBEDDER,
    HANDOFF,
    HTTP,
    KNOWLEDGE_API,
    METRICS,
    MODEL_WATCH,
    RUNTIME,
    SERVICE_TASKS,
    SETTINGS,
    WEB_CHANNEL,
    WIDGET_EVENTS,
)
from gateway.metrics import HttpMetrics
from gateway.middlewares import (
    body_deadline,
    errors,
    metrics,
    request_context,
    webhooks_first,
)
from gateway.runtime import open_answering, open_runtime
from gateway.worker import begin_stopping, start_services, stop_services

log = logging.getLogger(__name__)

# Largest request body accepted (webhooks and chat messages are far smaller).
MAX_BODY_BYTES = 1024 * 1024
# How long turns still streaming at shutdown get to finish and be saved.
TURN_DRAIN_SECONDS = 10.0
# Connections for the gateway: a turn may hold two at once (vector and full-text search).
POOL_SIZE = 20


def shutdown_grace(settings: Settings) -> float:
    """Seconds the requests in flight get to finish after SIGTERM: a widget stream or an API
    turn runs its whole turn inside its request, so as long as the slowest turn these settings
    allow (`core.jobs.turn_time`; no voice notes come over HTTP). In-process workers stop
    meanwhile (`gateway.worker.stop_grace`)."""
    return longest_turn(settings, voice=False)


async def _runtime(app: web.Application) -> AsyncIterator[None]:
    """The process's resources and its one answer side (`gateway.runtime`), shared by the
    channels, the admin API and the in-process workers."""
    settings = app[SETTINGS]
    async with (
        open_runtime(settings, pool_size=POOL_SIZE) as runtime,
        open_answering(runtime) as answering,
    ):
        await asyncio.to_thread(load_language_models)
        app[RUNTIME] = runtime
        app[ANSWERING] = answering
        app[DATABASE] = runtime.database
        app[CACHE] = runtime.cache
        app[EMBEDDER] = runtime.embedder
        app[HTTP] = runtime.http
        app[CHANNEL_CONTEXT].bind(
            runtime.agents,
            Inbox(runtime.database.pool),
            Outbox(runtime.database.pool),
            runtime.cache,
        )
        yield


async def _model_watch(app: web.Application) -> AsyncIterator[None]:
    """Whether the answer model is there: checked at once in the background, so a slow or
    absent model server never holds the start up; a failure is logged naming the model and
    its host, and /readyz shows it."""
    settings = app[SETTINGS]
    server = open_model_server(settings)
    if server is None:
        yield
        return
    watch = app[MODEL_WATCH] = ModelWatch(server, settings.llm_model)
    watch.start()
    yield
    await watch.close()


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
    """The HTTP channels that hand turns to the one pipeline."""
    answering = app[ANSWERING]
    runtime = answering.runtime
    pool, agents, pipeline = runtime.database.pool, runtime.agents, answering.pipeline
    app[WEB_CHANNEL] = WebChannel(
        pipeline,
        agents,
        runtime.cache,
        runtime.settings.public_url,
        client_address=client_address,
        feedback=Feedback(pool),
    )
    app[API_CHANNEL] = ApiChannel(pipeline, agents, ApiKeys(pool))
    app[KNOWLEDGE_API] = KnowledgeApi(app[API_CHANNEL], pipeline)
    app[WIDGET_EVENTS] = WidgetEvents(
        app[WEB_CHANNEL], agents, runtime.cache, app[CONVERSATION_FEED]
    )
    app[HANDOFF] = Handoff(pool, channels=BY_NAME, memory=pipeline.memory)
    log.info("gateway.answering mode=%s", "llm" if answering.chat else "extractive")
    yield
    await app[WEB_CHANNEL].drain(within=TURN_DRAIN_SECONDS)


async def _services(app: web.Application) -> AsyncIterator[None]:
    """The messaging workers, in-process, on the gateway's own pipeline, pool and caches."""
    tasks = app[SERVICE_TASKS] = start_services(app[ANSWERING])
    yield
    await stop_services(tasks)


async def _stop_claiming(app: web.Application) -> None:
    # While the last requests finish, the workers claim no more and finish their own turns.
    begin_stopping(app.get(SERVICE_TASKS, []))


async def _announce(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    # Everything loaded at startup (libraries, the embedder, settings) lives until the end:
    # frozen, the collector's full passes skip it instead of pausing requests to walk it.
    gc.collect()
    gc.freeze()
    log.info(
        "gateway.started host=%s port=%d grace=%.0f",
        settings.host,
        settings.port,
        shutdown_grace(settings),  # what a stop needs so that no request is cut short
    )
    yield
    log.info("gateway.stopping")


def create_app(
    settings: Settings, demo: DemoSite | None = None, *, background: bool = False
) -> web.Application:
    """Build the gateway; resources open on startup and close on cleanup, in reverse order.

    With ``demo``, the sample shop's pages are served at / with the widget on every page;
    with ``background``, the messaging workers run in this process too (`parley serve`).
    """
    middlewares = [body_deadline(settings.body_read_seconds), request_context, metrics, errors]
    if background:
        middlewares.insert(0, webhooks_first)  # outermost: a webhook's whole time counts
    app = web.Application(
        middlewares=middlewares,
        client_max_size=MAX_BODY_BYTES,
        # Also bounds how long a request's headers may take (README: "Behind a proxy").
        handler_args={"keepalive_timeout": settings.keepalive_seconds},
    )
    app[PROXY_TRUST] = ProxyTrust.of(settings)
    app[SETTINGS] = settings
    app[METRICS] = HttpMetrics()
    context = app[CHANNEL_CONTEXT] = ChannelContext(
        settings, client=lambda request: subscriber(client_address(request))
    )
    app.cleanup_ctx.extend([_model_watch, _runtime, _handoff, _channels])
    app.on_shutdown.append(_end_streams)
    setup_admin(app)
    if background:
        app.cleanup_ctx.append(_services)
        app.on_shutdown.append(_stop_claiming)
    app.cleanup_ctx.append(_announce)
    app.add_routes(health.routes)
    app.add_routes(routes.channel_routes())
    for channel in CHANNELS:
        app.add_routes(channel.routes(context))
    app.add_routes(widget_routes())
    if demo is not None:
        app.add_routes(demo_routes(demo.site_dir, demo.agent, demo.widget_key))
    return app
