"""Inbox rows as the channels' webhooks store them: parsed by the channel, payload kept."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from channels.inbound import validated
from channels.telegram import TelegramUpdate
from channels.telegram import parse_message as telegram_message
from channels.twilio import parse_message as twilio_message
from core.store.inbox import Inbox


async def add_delivery(
    inbox: Inbox,
    agent_id: int,
    channel: str,
    provider_message_id: str,
    conversation_key: str,
    payload: Mapping[str, Any],
) -> bool:
    """Store ``payload`` (a Twilio form or a Telegram Update) as its webhook would."""
    if channel == "telegram":
        update = validated(TelegramUpdate, dict(payload))
        assert update.message is not None
        message = telegram_message(update.update_id, update.message)
    else:
        fields = {k: v for k, v in payload.items() if isinstance(v, str | list)}
        message = twilio_message(fields, provider_message_id, conversation_key)
    return await inbox.add(agent_id, channel, message, payload)
