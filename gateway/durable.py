"""The durable messaging services of `parley worker`: the inbox worker and the outbox sender."""

from __future__ import annotations

from typing import Any

from channels.delivery import split_message
from channels.telegram_send import TelegramSender
from channels.twilio_send import TwilioSender
from core.answer.factory import build_pipeline
from core.jobs.inbox_worker import InboxWorker
from core.jobs.outbox_sender import OutboxSender
from core.llm.openai_chat import close_chat_model, open_chat_model
from core.store.agents import Agents
from gateway.runtime import Runtime

AGENT_FRESH_SECONDS = 30.0


async def run_inbox_worker(runtime: Runtime) -> None:
    """Answers WhatsApp and Telegram inbox rows with the shared pipeline, until cancelled."""
    settings, pool = runtime.settings, runtime.database.pool
    chat = open_chat_model(settings)
    agents = Agents(pool, fresh_for=AGENT_FRESH_SECONDS)
    pipeline = build_pipeline(
        settings, pool, runtime.cache, runtime.embedder, runtime.http, chat, agents
    )
    splitters = {
        "whatsapp": lambda text: split_message(text, TwilioSender.limit),
        "telegram": lambda text: split_message(text, TelegramSender.limit),
    }
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
        await InboxWorker(pool, pipeline, splitters=splitters, typing=typing).run()
    finally:
        await close_chat_model(chat)
        if typing_sender is not None:
            await typing_sender.close()


async def run_outbox_sender(runtime: Runtime) -> None:
    """Sends queued reply parts with the environment's channel credentials, until cancelled.

    Per-agent credentials (``settings.twilio`` / ``settings.telegram``) are not used yet: one
    Twilio account and one Telegram bot per process. A channel without credentials has no
    sender, and its parts fail with ``no_sender``.
    """
    settings = runtime.settings
    senders: dict[str, Any] = {}
    if (
        settings.twilio_account_sid
        and settings.twilio_auth_token is not None
        and settings.twilio_whatsapp_from
    ):
        senders["whatsapp"] = TwilioSender(
            settings.twilio_account_sid,
            settings.twilio_auth_token.get_secret_value(),
            settings.twilio_whatsapp_from,
            api_base=str(settings.twilio_api_base),
            status_callback=(
                f"{settings.public_url}/webhooks/twilio/status" if settings.public_url else None
            ),
        )
    if settings.telegram_bot_token is not None:
        senders["telegram"] = TelegramSender(
            settings.telegram_bot_token.get_secret_value(),
            api_base=str(settings.telegram_api_base),
        )
    try:
        await OutboxSender(runtime.database.pool, senders).run()
    finally:
        for sender in senders.values():
            await sender.close()
