"""Asking a messaging customer "Did this answer your question?" once staff resolved their
conversation, and reading their answer.

Off unless the agent's ``feedback_prompt`` setting is true. The prompt is about the bot's
last answer and is queued like any reply. Where the channel shows buttons (Telegram) the
customer presses one, and the press comes back as `core.inbound.FeedbackAnswer`; elsewhere
(WhatsApp) they are asked to reply 1 or 2, and their next message, if it says so and comes
within `OPEN_HOURS`, is the rating. Either way the rating is stored like the widget's thumbs
(`core.store.feedback.Feedback`): a thumbs-down shows among the content gaps.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from core.answer.phrases import base_language, phrase
from core.delivery import ChannelRules, Channels, Choice
from core.errors import InvalidInput
from core.handoff import CustomerWindow
from core.inbound import FeedbackAnswer, InboundMessage, Rating
from core.store.agents import Agent, Agents
from core.store.conversations import Conversations
from core.store.feedback import Feedback
from core.store.feedback_prompts import (
    AnswerBy,
    FeedbackPrompt,
    FeedbackPromptStore,
    ask,
    last_answer,
)
from core.store.handoff import HandoffStore
from core.store.outbox import enqueue

log = logging.getLogger(__name__)

SETTING = "feedback_prompt"
# How long after the prompt the customer's next message may still be their rating.
OPEN_HOURS = 24.0

# Words that answer yes or no, by language; English ones count in every conversation, as the
# prompt falls back to English.
_YES: Mapping[str, frozenset[str]] = {
    "en": frozenset({"yes"}),
    "nl": frozenset({"ja"}),
    "de": frozenset({"ja"}),
    "fr": frozenset({"oui"}),
    "es": frozenset({"sí", "si"}),
    "it": frozenset({"sì", "si"}),
}
_NO: Mapping[str, frozenset[str]] = {
    "en": frozenset({"no"}),
    "nl": frozenset({"nee"}),
    "de": frozenset({"nein"}),
    "fr": frozenset({"non"}),
    "es": frozenset({"no"}),
    "it": frozenset({"no"}),
}
# An emoji's variation selector and skin tones: 👍🏽 is 👍.
_EMOJI_MODIFIERS = re.compile("[\ufe0f\U0001f3fb-\U0001f3ff]")


def asks_for_feedback(settings: Mapping[str, Any]) -> bool:
    """Whether the agent asks (its ``feedback_prompt`` setting; off by default)."""
    return settings.get(SETTING) is True


def validate_feedback_settings(settings: Mapping[str, Any]) -> None:
    """Check an agent's feedback setting before it is saved; raises `InvalidInput`."""
    if not isinstance(settings.get(SETTING, False), bool):
        raise InvalidInput(f"{SETTING} must be true or false")


def rating_in(text: str, language: str | None) -> Rating | None:
    """The rating a reply to "Reply 1 for yes, 2 for no" gives: "1" or "2", 👍 or 👎, or yes
    or no in the conversation's language (or English); None for anything else."""
    said = _EMOJI_MODIFIERS.sub("", text).strip().rstrip(".!").strip().casefold()
    base = base_language(language)
    if said in {"1", "👍"} | _YES[base] | _YES["en"]:
        return "up"
    if said in {"2", "👎"} | _NO[base] | _NO["en"]:
        return "down"
    return None


def prompt_message(rules: ChannelRules, turn_id: int, language: str) -> tuple[str, list[Choice]]:
    """The prompt's text in ``language``, and its buttons where the channel has them."""
    if not rules.buttons:
        return phrase("feedback_question_reply", language), []
    return phrase("feedback_question", language), [
        Choice(phrase("feedback_yes", language), FeedbackAnswer(turn_id, "up").data),
        Choice(phrase("feedback_no", language), FeedbackAnswer(turn_id, "down").data),
    ]


class FeedbackPrompter:
    """Queues the prompt when staff resolve a conversation.

    ``channels`` are the messaging channels' rules (the gateway passes its registry): the
    prompt goes only to a messaging customer (the widget has thumbs of its own), cut and
    written as the channel wants it, and only within the channel's customer window (WhatsApp:
    outside it only a template would arrive, and none is sent for this). ``queued`` is called
    once a prompt is in the outbox.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        agents: Agents,
        *,
        channels: Channels,
        queued: Callable[[], None] | None = None,
    ) -> None:
        self._pool = pool
        self._agents = agents
        self._channels = channels
        self._handoff = HandoffStore(pool)
        self._conversations = Conversations(pool)
        self._queued = queued or (lambda: None)

    async def after_resolved(self, conversation_id: int) -> bool:
        """Ask the customer about the bot's last answer, once per answer; True if queued."""
        state = await self._handoff.conversation(conversation_id)
        rules = self._channels.get(state.channel)
        if rules is None:
            return False
        agent = await self._agents.by_id(state.agent_id)
        if not asks_for_feedback(agent.settings):
            return False
        hours = rules.customer_window_hours
        if hours is not None:
            window = CustomerWindow(hours, state.customer_wrote_at, datetime.now(UTC))
            if not window.open:
                log.info(
                    "feedback.prompt.skipped conversation_id=%d reason=window_closed",
                    conversation_id,
                )
                return False
        known = await self._conversations.language(agent.id, state.channel, state.conversation_key)
        language = base_language(known or agent.default_language)
        async with self._pool.acquire() as conn, conn.transaction():
            turn_id = await last_answer(conn, conversation_id)
            if turn_id is None:
                log.info(
                    "feedback.prompt.skipped conversation_id=%d reason=no_answer", conversation_id
                )
                return False
            answer_by: AnswerBy = "buttons" if rules.buttons else "text"
            if not await ask(conn, conversation_id, turn_id, answer_by):
                return False  # asked about this answer already (resolved twice)
            text, choices = prompt_message(rules, turn_id, language)
            parts = [p for p in rules.reply_parts(text, (), language=language) if p.strip()]
            await enqueue(
                conn,
                agent_id=agent.id,
                channel=state.channel,
                recipient=state.conversation_key,
                parts=parts,
                conversation_id=conversation_id,
                choices=choices,
            )
        self._queued()
        log.info(
            "feedback.prompt.queued conversation_id=%d turn_id=%d language=%s",
            conversation_id,
            turn_id,
            language,
        )
        return True


@dataclass(frozen=True, slots=True)
class Taken:
    """What of one conversation's new messages was feedback.

    ``rest``: the messages to answer as usual. ``said``: the ratings stored, as the transcript
    shows them ("2", "👎 No"). ``receipts``: button presses to acknowledge (each one, rated
    or not). ``prompt``: the prompt open when the messages came; the reply closes it.
    """

    rest: tuple[InboundMessage, ...]
    said: tuple[str, ...] = ()
    receipts: tuple[str, ...] = ()
    prompt: FeedbackPrompt | None = None


class FeedbackReplies:
    """Finds the ratings among a customer's messages and stores them."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._prompts = FeedbackPromptStore(pool)
        self._feedback = Feedback(pool)
        self._handoff = HandoffStore(pool)
        self._conversations = Conversations(pool)

    async def take(
        self, agent: Agent, channel: str, key: str, messages: Sequence[InboundMessage]
    ) -> Taken:
        """Store the ratings among ``messages`` (oldest first) and tell what is left.

        A button press rates the turn it names, if that turn is this conversation's (never
        another's, whatever the press says). A message in words is a rating only when it is
        the first since an open, recent prompt that asked for one, and says yes or no.
        """
        prompt = await self._prompts.open(agent.id, channel, key, fresh_hours=OPEN_HOURS)
        rest: list[InboundMessage] = []
        said: list[str] = []
        receipts: list[str] = []
        language: str | None = None
        first = True
        for message in messages:
            answer = message.feedback
            if answer is not None:
                if answer.receipt:
                    receipts.append(answer.receipt)
                if await self._feedback.record(
                    agent.id, channel, key, answer.turn_id, answer.rating
                ):
                    language = language or await self._language(agent, channel, key)
                    label = "feedback_yes" if answer.rating == "up" else "feedback_no"
                    said.append(phrase(label, language))
                else:
                    log.warning("feedback.answer.refused channel=%s", channel)
                continue
            if first and prompt is not None and prompt.fresh and prompt.answer_by == "text":
                language = language or await self._language(agent, channel, key)
                if await self._rated(agent, channel, key, prompt, message, language):
                    said.append(message.text.strip())
                    first = False
                    continue
            first = False
            rest.append(message)
        return Taken(tuple(rest), tuple(said), tuple(receipts), prompt)

    async def _rated(
        self,
        agent: Agent,
        channel: str,
        key: str,
        prompt: FeedbackPrompt,
        message: InboundMessage,
        language: str,
    ) -> bool:
        if message.media or message.command is not None:
            return False
        rating = rating_in(message.text, language)
        if rating is None:
            return False
        state = await self._handoff.state(agent.id, channel, key)
        if state is not None and state.held:
            return False  # staff have the conversation again: the message is theirs to read
        return await self._feedback.record(agent.id, channel, key, prompt.turn_id, rating)

    async def _language(self, agent: Agent, channel: str, key: str) -> str:
        known = await self._conversations.language(agent.id, channel, key)
        return base_language(known or agent.default_language)
