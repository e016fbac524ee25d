"""The durable messaging services of `parley worker`: the inbox worker and the outbox sender."""

from __future__ import annotations

from typing import Any

from channels.citations import ReplyParts
from channels.credentials import (
    ChannelNotConfigured,
    telegram_bot_token,
    twilio_credentials,
)
from channels.telegram_send import TelegramSender
from channels.twilio_send import TwilioSender
from core.answer.factory import build_pipeline
from core.jobs.inbox_worker import InboxWorker
from core.jobs.outbox_sender import OutboxSender
from core.llm.openai_chat import close_chat_model, open_chat_model
from core.settings import Settings
from core.store.agents import Agent, Agents
from core.store.inbox import Backoff
from gateway.runtime import Runtime

AGENT_FRESH_SECONDS = 30.0
# Summaries still being written at shutdown get this long; the catch-up job does the rest.
SUMMARY_DRAIN_SECONDS = 5.0


def reply_splitters() -> dict[str, ReplyParts]:
    """How a reply is cut into messages per channel, its cited sources listed at the end
    (for the inbox worker and staff replies)."""
    return {
        "whatsapp": ReplyParts(TwilioSender.limit),
        "telegram": ReplyParts(TelegramSender.limit),
    }


async def run_inbox_worker(runtime: Runtime) -> None:
    """Answers WhatsApp and Telegram inbox rows with the shared pipeline, until cancelled."""
    settings, pool = runtime.settings, runtime.database.pool
    chat = open_chat_model(settings)
    agents = Agents(pool, fresh_for=AGENT_FRESH_SECONDS)
    pipeline = build_pipeline(
        settings,
        pool,
        runtime.cache,
        runtime.embedder,
        runtime.http,
        chat,
        agents,
        limits=runtime.model_limits,
    )
    splitters = reply_splitters()
    typing_sender = (
        TelegramSender(
            settings.telegram_bot_token.get_secret_value(),
            api_base=str(settings.telegram_api_base),
        )
        if settings.telegram_bot_token is not None
        else None
    )
    typing = {"telegram": typing_sender.keep_typing} if typing_sender is not None else {}
    try:
        await InboxWorker(
            pool,
            pipeline,
            burst_window=settings.burst_window_seconds,
            concurrency=settings.worker_concurrency,
            cpu_slots=settings.worker_cpu_slots,
            limits=runtime.model_limits,
            redo_when_superseded=settings.redo_when_superseded,
            splitters=splitters,
            typing=typing,
            memory=pipeline.memory,
            backoff=Backoff(limit=settings.inbox_retry_hours * 3600),
            holding_after=settings.holding_message_seconds,
            queued=runtime.outbox_queued.set,
        ).run()
    finally:
        await pipeline.memory.drain(within=SUMMARY_DRAIN_SECONDS)
        await close_chat_model(chat)
        if typing_sender is not None:
            await typing_sender.close()


class AgentSenders:
    """The sender for each agent's channel, with the agent's own account when it has one
    (``settings.twilio`` / ``settings.telegram``), else the environment's. Senders are kept
    while their credentials stay the same, and rebuilt when staff change them."""

    def __init__(self, settings: Settings, agents: Agents) -> None:
        self._settings = settings
        self._agents = agents
        self._senders: dict[tuple[int, str], tuple[tuple[str, ...], Any]] = {}

    async def sender_for(self, agent_id: int, channel: str) -> Any:
        agent = await self._agents.by_id(agent_id)
        made = self._make(agent, channel)
        if made is None:
            return None
        fingerprint, build = made
        known = self._senders.get((agent_id, channel))
        if known is not None and known[0] == fingerprint:
            return known[1]
        if known is not None:
            await known[1].close()
        sender = build()
        self._senders[(agent_id, channel)] = (fingerprint, sender)
        return sender

    def _make(self, agent: Agent, channel: str) -> tuple[tuple[str, ...], Any] | None:
        settings = self._settings
        if channel == "whatsapp":
            try:
                twilio = twilio_credentials(agent, settings)
            except ChannelNotConfigured:
                return None
            if not twilio.account_sid or not twilio.whatsapp_from:
                return None
            token = twilio.auth_token.get_secret_value()
            callback = None
            if settings.public_url:
                # Verified with the agent's credentials, and changes only its messages.
                callback = f"{settings.public_url}/webhooks/twilio/status?agent={agent.slug}"
            sid, sender_from = twilio.account_sid, twilio.whatsapp_from
            return (sid, token, sender_from, callback or ""), lambda: TwilioSender(
                sid,
                token,
                sender_from,
                api_base=str(settings.twilio_api_base),
                status_callback=callback,
                timeout=settings.twilio_send_timeout_seconds,
            )
        if channel == "telegram":
            try:
                bot = telegram_bot_token(agent, settings)
            except ChannelNotConfigured:
                return None
            if bot is None:
                return None
            value = bot.get_secret_value()
            return (value,), lambda: TelegramSender(
                value,
                api_base=str(settings.telegram_api_base),
                timeout=settings.telegram_send_timeout_seconds,
            )
        return None

    async def close(self) -> None:
        for _, sender in self._senders.values():
            await sender.close()
        self._senders.clear()


async def run_outbox_sender(runtime: Runtime) -> None:
    """Sends queued reply parts, each with its agent's channel account, until cancelled.

    A channel an agent has no credentials for has no sender; its parts fail with
    ``no_sender``.
    """
    senders = AgentSenders(
        runtime.settings, Agents(runtime.database.pool, fresh_for=AGENT_FRESH_SECONDS)
    )
    try:
        await OutboxSender(runtime.database.pool, senders, wake=runtime.outbox_queued).run()
    finally:
        await senders.close()
