"""Every piece of state the gateway shares between handlers, as typed application keys."""

from __future__ import annotations

import asyncio

import aiohttp
import jinja2
from aiohttp import web

from channels.api import ApiChannel
from channels.base import ChannelContext
from channels.knowledge_api import KnowledgeApi
from channels.web import WebChannel
from channels.web_events import WidgetEvents
from core.handoff import ConversationFeed, Handoff
from core.llm.probe import ModelWatch
from core.ports import Cache, Embedder
from core.settings import Settings
from core.store import Database
from gateway.admin.services import AdminServices
from gateway.metrics import HttpMetrics
from gateway.runtime import Answering, Runtime

SETTINGS = web.AppKey("settings", Settings)
DATABASE = web.AppKey("database", Database)
CACHE = web.AppKey("cache", Cache)
EMBEDDER = web.AppKey("embedder", Embedder)
HTTP = web.AppKey("http", aiohttp.ClientSession)
# The process's resources and its one answer side (pipeline, senders), opened at startup.
RUNTIME = web.AppKey("runtime", Runtime)
ANSWERING = web.AppKey("answering", Answering)
# The messaging channels' stores, bound at startup; their routes are mounted before.
CHANNEL_CONTEXT = web.AppKey("channel_context", ChannelContext)
METRICS = web.AppKey("metrics", HttpMetrics)
WEB_CHANNEL = web.AppKey("web_channel", WebChannel)
API_CHANNEL = web.AppKey("api_channel", ApiChannel)
KNOWLEDGE_API = web.AppKey("knowledge_api", KnowledgeApi)
CONVERSATION_FEED = web.AppKey("conversation_feed", ConversationFeed)
HANDOFF = web.AppKey("handoff", Handoff)
WIDGET_EVENTS = web.AppKey("widget_events", WidgetEvents)
ADMIN = web.AppKey("admin", AdminServices)
# The background services `parley serve` runs in-process (none with --no-workers).
SERVICE_TASKS: web.AppKey[list[asyncio.Task[None]]] = web.AppKey("service_tasks")
CONSOLE_TEMPLATES = web.AppKey("console_templates", jinja2.Environment)
# Whether the answer model is there (set only with a model configured): /readyz asks it.
MODEL_WATCH = web.AppKey("model_watch", ModelWatch)
