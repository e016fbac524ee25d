"""Answers the inbox: claims one chat's waiting messages, answers them as one turn, queues it.

Durable channels (WhatsApp, Telegram) store each delivery before acknowledging it; this worker
turns them into replies. Per conversation it waits until the visitor has been quiet for
``burst_window`` seconds, so "hi" / "I ordered shoes" / "where are they?" is answered once.
A claim is a lease: a worker that dies mid-turn leaves its rows 'processing' until the lease
ends, then another worker takes them. The reply parts and the rows' 'done' are written in one
transaction, and a worker whose lease was taken over writes nothing, so each burst gets
exactly one reply.

A turn spends most of its time waiting for the language model. Its own work (embedding,
searching, quoting, saving) runs in one of a few work slots (`core.slots`), given back while
it waits on the model; many turns (``concurrency``) may be in flight at once. The claim loop
takes a conversation only when a slot is free to start on it at once, so a process never sits
on messages another process could be answering, and takes none of an agent whose answers
already wait for its model limits (`core.llm.limits`): other agents' customers need not wait
behind them.

A turn that fails because a service is down (the model, PostgreSQL, Redis) is tried again
with exponential back-off until it succeeds or its time limit passes; only errors that no
retry can mend (a request the model refuses, such as a wrong key or model name, or a
message that can never become a turn) end a row at once. A customer still waiting after
``holding_after`` seconds is told once, through the outbox like any reply, that the answer
is delayed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

import asyncpg
import pydantic
import redis.exceptions

from core.answer.phrases import phrase
from core.answer.pipeline import AnswerPipeline
from core.answer.question import guess_language
from core.answer.sources import SourceRef
from core.delivery import Channels, ChoiceSender, Senders, TypingSender, sender_of
from core.errors import MediaUnavailable, ModelFailed, ParleyError, Unavailable
from core.feedback import FeedbackReplies, Taken
from core.inbound import InboundMessage, MediaItem
from core.llm.limits import ModelLimits
from core.locale import detect_language
from core.memory import ConversationMemory
from core.slots import Slot, WorkSlots, working_in
from core.store.agents import Agent, Agents
from core.store.conversations import Conversations, TurnRecord, discard_turn, reply_message_id
from core.store.feedback_prompts import FeedbackPrompt
from core.store.feedback_prompts import close as close_prompt
from core.store.handoff import HandoffStore
from core.store.inbox import (
    Backoff,
    Holding,
    InboxClaim,
    InboxLeases,
    InboxRow,
    complete,
    hold,
    newer_waiting,
    put_back,
)
from core.store.outbox import enqueue
from core.tags import channel_filters
from core.turns import MAX_MESSAGE_CHARS, CollectingTurnOutput, TurnRequest

log = logging.getLogger(__name__)


class Transcripts(Protocol):
    """Turns a customer's voice note into text (the gateway downloads it with the channel's
    credentials and sends it to the transcription model)."""

    @property
    def available(self) -> bool:
        """False when no transcription model is configured."""
        ...

    async def transcript(self, agent_id: int, channel: str, item: MediaItem) -> str:
        """The voice note's words ('' when nothing could be heard); raises when the
        download or the model failed (transient failures are tried again)."""
        ...


DEFAULT_WELCOME = "Hi! Ask me anything and I will do my best to help."
MEDIA_QUESTION = "[media]"  # what the conversation shows for a message without text
VOICE_QUESTION = "[voice]"  # ... for a voice note that could not be transcribed

# Failures of a service that is down or overloaded: the same turn may well work later.
_TRANSIENT: tuple[type[BaseException], ...] = (
    Unavailable,
    TimeoutError,
    OSError,  # connection refused or reset
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # shutting down, starting up, cancelled
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    asyncpg.exceptions.TransactionRollbackError,  # deadlock, serialization failure
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)
# Failures no retry can mend: the message itself cannot be answered.
_PERMANENT: tuple[type[BaseException], ...] = (ParleyError, pydantic.ValidationError)
# Longest pause of the claiming loop while the database cannot be reached.
_MAX_LOOP_PAUSE = 30.0
# How long a stopping worker tries to hand back the rows of a turn it could not finish.
_GIVE_BACK_SECONDS = 5.0

FailureKind = Literal["transient", "permanent", "unexpected"]


def failure_kind(exc: BaseException) -> FailureKind:
    """Whether a failed turn is worth trying again: ``transient`` (a service was down; tried
    until the time limit), ``permanent`` (never), ``unexpected`` (a bug, perhaps: a few times)."""
    if isinstance(exc, ModelFailed) and not exc.transient:
        return "permanent"  # the model refused the request itself: a 400, 401, 403, 404
    if isinstance(exc, _TRANSIENT):
        return "transient"
    if isinstance(exc, _PERMANENT):
        return "permanent"
    return "unexpected"


class _LeaseLost(Exception):
    """Another worker took the rows over after this worker's lease ended."""


class _Superseded(Exception):
    """A newer message of the conversation arrived while the reply was being made."""


@dataclass(frozen=True, slots=True)
class _Reply:
    text: str
    conversation_id: int | None
    turn_id: int | None
    sources: Sequence[SourceRef] = ()
    language: str | None = None
    site: str | None = None
    # The feedback prompt open when the messages came: whatever they were, they close it.
    prompt: FeedbackPrompt | None = None


class InboxWorker:
    """Answers waiting inbox rows, one conversation at a time, conversations in parallel:
    up to ``concurrency`` turns in flight, of which ``cpu_slots`` do their own work at once
    (the others wait on the model). ``limits`` are the pipeline's model limits: an agent
    whose answers wait for them gets no more of its conversations claimed meanwhile.

    ``channels`` are the messaging channels' rules (core imports no channel: the gateway
    passes its registry): how a reply is written and cut into parts, the sources it cites
    listed at the end. ``senders`` show the customer "typing..." where the channel can;
    ``transcripts`` turn voice notes into questions.

    A failed turn goes back to waiting: after a transient failure with ``backoff``, until its
    time limit; after an unexpected one likewise, but for ``max_attempts`` tries in all; after
    a permanent one it fails at once. ``holding_after`` seconds after a message came in
    without an answer, the customer gets the holding sentence once (0: never). ``queued`` is
    called after a reply or a holding message went into the outbox. While ``defer`` returns
    True, more urgent work of the process waits (its webhooks): no new turn starts and no
    holding message is queued. Stopped (cancelled), it claims no more and gives the turns in
    flight ``grace`` seconds to finish.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        pipeline: AnswerPipeline,
        *,
        burst_window: float = 1.0,
        lease: float = 60.0,
        concurrency: int = 256,
        cpu_slots: int = 4,
        limits: ModelLimits | None = None,
        poll_interval: float = 0.25,
        max_attempts: int = 3,
        max_rows: int = 20,
        channels: Channels | None = None,
        senders: Senders | None = None,
        transcripts: Transcripts | None = None,
        redo_when_superseded: bool = True,
        memory: ConversationMemory | None = None,
        backoff: Backoff | None = None,
        holding_after: float = 30.0,
        queued: Callable[[], None] | None = None,
        defer: Callable[[], bool] | None = None,
        grace: float = 0.0,
    ) -> None:
        self._pool = pool
        self._pipeline = pipeline
        self._leases = InboxLeases(pool)
        self._conversations = Conversations(pool)
        self._handoff = HandoffStore(pool)
        self._agents = Agents(pool)
        self._feedback = FeedbackReplies(pool)
        self._burst = burst_window
        self._lease = lease
        self._concurrency = concurrency
        # While ``defer`` says so (webhooks of this process waiting), no new turn starts.
        self._deferring = defer or (lambda: False)
        self._slots = WorkSlots(cpu_slots, on_free=self._wake_up, defer=defer)
        self._limits = limits
        # Turns in flight per agent, and whether the claim loop stopped for want of room.
        self._in_flight: Counter[int] = Counter()
        self._room = asyncio.Event()
        self._full = False
        self._poll = poll_interval
        self._max_attempts = max_attempts
        self._max_rows = max_rows
        self._channels = channels or {}
        self._senders = senders
        self._transcripts = transcripts
        self._redo = redo_when_superseded
        # The pipeline's memory: canned turns saved here, and turns taken back, reach it too.
        self._memory = memory
        self._backoff = backoff or Backoff()
        self._holding_after = holding_after
        # Told whenever messages were queued in the outbox (the sender may send them at once).
        self._queued = queued or (lambda: None)
        self._grace = grace

    @property
    def slots(self) -> WorkSlots:
        return self._slots

    async def run(self) -> None:
        """Claim and answer until cancelled; then claim no more, give the turns in flight
        ``grace`` seconds, and cancel those still running: their rows go back at once, for
        another worker (or, if that fails, when their lease ends).

        The loop outlives a database outage: it pauses longer each time the database
        cannot be reached, and carries on once it can.
        """
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        # Each step backs off on its own: failing holding messages must not slow the answers.
        pause, holding_pause, holding_due = self._poll, self._poll, loop.time()
        try:
            while True:
                # Holding messages are new work too: they wait while the process defers.
                if loop.time() >= holding_due and not self._deferring():
                    if await _survived("holding", self.send_holding_messages()):
                        holding_pause = self._poll
                    else:
                        holding_pause = min(holding_pause * 2, _MAX_LOOP_PAUSE)
                    holding_due = loop.time() + holding_pause
                if await _survived("claim", self._claim_into(tasks)):
                    pause = self._poll
                else:
                    pause = min(pause * 2, _MAX_LOOP_PAUSE)
                    self._full = False
                if self._full:
                    # Stopped for want of a slot, not of work: carry on as soon as one frees.
                    # (asyncio.timeout, not wait_for: on Python 3.11 wait_for drops a
                    # cancellation that arrives as the event is set, and the loop would run on.)
                    with suppress(TimeoutError):
                        async with asyncio.timeout(pause):
                            await self._room.wait()
                else:
                    await asyncio.sleep(pause)
        finally:
            try:
                if tasks and self._grace > 0:
                    log.info("inbox.stopping turns=%d grace=%.0f", len(tasks), self._grace)
                    await asyncio.wait(tasks, timeout=self._grace)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def _wake_up(self) -> None:
        self._room.set()

    async def _claim_into(self, tasks: set[asyncio.Task[None]]) -> None:
        """Claim conversations while a work slot is free, up to ``concurrency`` in flight."""
        self._room.clear()  # from here on, any slot that frees wakes the loop again
        self._full = True
        while len(tasks) < self._concurrency:
            slots: list[Slot] = []
            while len(slots) < self._concurrency - len(tasks):
                slot = self._slots.try_take()
                if slot is None:
                    break
                slots.append(slot)
            if not slots:
                return
            claims: list[InboxClaim] = []
            claiming = asyncio.ensure_future(
                self._leases.claim_many(
                    len(slots),
                    quiet_for=self._burst,
                    lease=self._lease,
                    max_rows=self._max_rows,
                    skip_agents=self._agents_held_back(),
                )
            )
            try:
                claims = await asyncio.shield(claiming)
            except asyncio.CancelledError:
                await self._give_back_claimed(claiming)  # told to stop in the middle of it
                raise
            finally:
                for slot in slots[len(claims) :]:
                    slot.give_back()
            for claim, slot in zip(claims, slots, strict=False):
                task = asyncio.create_task(self._answer(claim, slot))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(lambda _: self._wake_up())
            if len(claims) < len(slots):
                self._full = False  # nothing more is ready
                return

    def _agents_held_back(self) -> list[int]:
        """Agents whose answers wait for their model limits in this process."""
        if self._limits is None:
            return []
        limits = self._limits
        return [agent for agent, n in self._in_flight.items() if n and limits.waiting(agent)]

    async def process_next(self) -> bool:
        """Claim one conversation and answer it now; False when none is ready."""
        slot = await self._slots.take()
        try:
            claim = await self._claim()
        except BaseException:
            slot.give_back()
            raise
        if claim is None:
            slot.give_back()
            return False
        await self._answer(claim, slot)
        return True

    async def _claim(self) -> InboxClaim | None:
        return await self._leases.claim(
            quiet_for=self._burst, lease=self._lease, max_rows=self._max_rows
        )

    # -- answering ------------------------------------------------------------------------

    async def _answer(self, claim: InboxClaim, slot: Slot) -> None:
        """Answer the claim with the work slot given (released at the end)."""
        agent_id = claim.first.agent_id
        self._in_flight[agent_id] += 1
        try:
            with working_in(slot):
                await self._answer_in_slot(claim)
        finally:
            self._in_flight[agent_id] -= 1
            if not self._in_flight[agent_id]:
                del self._in_flight[agent_id]

    async def _answer_in_slot(self, claim: InboxClaim) -> None:
        first = claim.first
        holder: list[InboxClaim] = [claim]
        stop = asyncio.Event()
        heartbeat = asyncio.create_task(self._keep_lease(holder, stop))
        try:
            reply = await self._reply_while_typing(claim)
        except asyncio.CancelledError:
            heartbeat.cancel()
            await self._give_back(holder[0])
            raise
        except Exception as exc:
            stop.set()
            await heartbeat
            await self._release(holder[0], exc)
            return
        stop.set()
        await heartbeat  # not cancelled: a renewal in flight must land in `holder`
        try:
            await self._finish(holder[0], reply)
        except asyncio.CancelledError:
            await self._give_back(holder[0])  # unless the reply was queued: its rows are done
            raise
        except _Superseded:
            log.info(
                "inbox.turn.superseded channel=%s inbox_id=%d: redone with the newer message",
                first.channel,
                first.id,
            )
            return
        except _LeaseLost:
            log.warning("inbox.claim.lost channel=%s inbox_id=%d", first.channel, first.id)
            return
        except Exception as exc:
            # Nothing was queued: once the lease ends the messages are answered again.
            log.warning(
                "inbox.turn.unfinished channel=%s inbox_id=%d error=%r",
                first.channel,
                first.id,
                exc,
            )
            return
        self._queued()
        log.info(
            "inbox.turn.answered channel=%s inbox_id=%d messages=%d",
            first.channel,
            first.id,
            len(claim.rows),
        )

    async def _with_staff(self, row: InboxRow) -> bool:
        state = await self._handoff.state(row.agent_id, row.channel, row.conversation_key)
        return state is not None and state.held

    async def _typing_sender(self, first: InboxRow) -> TypingSender | None:
        if self._senders is None:
            return None
        sender = await sender_of(self._senders, first.agent_id, first.channel)
        if not isinstance(sender, TypingSender) or await self._with_staff(first):
            return None  # staff answer in their own time: the bot shows no "typing..."
        return sender

    async def _reply_while_typing(self, claim: InboxClaim) -> _Reply:
        first, last = claim.first, claim.rows[-1]
        try:
            indicator = await self._typing_sender(first)
        except Exception as exc:  # a courtesy: never fails the turn
            log.warning("inbox.typing.unavailable channel=%s error=%r", first.channel, exc)
            indicator = None
        if all(row.inbound.feedback is not None for row in claim.rows):
            indicator = None  # a button pressed: nothing to think about
        answered = asyncio.Event()
        typing = (
            asyncio.create_task(
                indicator.keep_typing(
                    first.conversation_key, last.inbound.provider_message_id, answered
                )
            )
            if indicator is not None
            else None
        )
        try:
            return await self._reply(claim)
        finally:
            answered.set()
            if typing is not None:
                # The indicator is a courtesy: its failures never fail the turn.
                await asyncio.gather(typing, return_exceptions=True)

    async def _give_back(self, claim: InboxClaim, what: str = "turn") -> None:
        """A turn stopped before its end (or a claim a stop interrupted before its turn began,
        ``what="claim"``): its rows wait again at once, for another worker. If that fails
        they stay 'processing' until the lease runs out, and are taken then."""
        try:
            async with asyncio.timeout(_GIVE_BACK_SECONDS):
                given = await self._leases.give_back(claim)
        except Exception as exc:
            log.warning("inbox.give_back.failed inbox_id=%d error=%r", claim.first.id, exc)
            return
        log.info("inbox.%s.given_back inbox_id=%d given=%s", what, claim.first.id, given)

    async def _give_back_claimed(self, claiming: asyncio.Future[list[InboxClaim]]) -> None:
        """What a claim interrupted by a stop took, back at once (no turn will answer it)."""
        try:
            async with asyncio.timeout(_GIVE_BACK_SECONDS):
                claims = await claiming
        except Exception:
            return  # nothing was claimed, or the rows wait for their lease to end
        for claim in claims:
            await self._give_back(claim, "claim")

    async def _keep_lease(self, holder: list[InboxClaim], stop: asyncio.Event) -> None:
        """Extends the lease while a long turn runs, so no other worker takes the rows."""
        while True:
            try:
                async with asyncio.timeout(self._lease / 3):
                    await stop.wait()
                return
            except TimeoutError:
                pass
            try:
                renewed = await self._leases.renew(holder[0], self._lease)
            except Exception as exc:
                # Perhaps the database is away for a moment; the next renewal may work.
                log.warning("inbox.lease.renew_failed error=%r", exc)
                continue
            if renewed is None:
                return
            holder[0] = renewed

    async def _reply(self, claim: InboxClaim) -> _Reply:
        first = claim.first
        agent = await self._agents.by_id(first.agent_id)
        messages = [row.inbound for row in claim.rows]
        await self._remember_customer(first, messages)
        taken = await self._feedback.take(agent, first.channel, first.conversation_key, messages)
        await self._acknowledge(first, taken.receipts)
        reply = await self._reply_to(claim, agent, taken)
        return replace(reply, prompt=taken.prompt)

    async def _reply_to(self, claim: InboxClaim, agent: Agent, taken: Taken) -> _Reply:
        """The reply to the messages that were not feedback, or thanks for the feedback."""
        first = claim.first
        messages = taken.rest
        if not messages:
            if not taken.said:
                return _Reply("", None, None)  # presses that rated nothing: nothing to say
            # In the language the customer was asked in: the conversation's.
            known = await self._conversations.language(
                agent.id, first.channel, first.conversation_key
            )
            language = (
                _base_language(known)
                if known
                else await self._language(claim, agent.default_language)
            )
            thanks = phrase("feedback_thanks", language)
            return await self._canned(claim, "\n".join(taken.said), thanks, language, "feedback")
        questions: list[str] = []
        heard: list[dict[str, str]] = []
        unheard: MediaItem | None = None
        for message in messages:
            if message.command is not None:
                continue
            if message.text:
                questions.append(message.text)
                continue
            voice = message.voice
            if voice is not None and self._transcripts is not None and self._transcripts.available:
                words = await self._heard(first, voice)
                if words:
                    questions.append(words)
                    heard.append({"media": voice.ref, "transcript": words})
                    continue
            if message.media:
                unheard = voice or unheard or message.media[0]
        if not questions:
            if any(m.command == "start" for m in messages) and unheard is None:
                welcome = str(agent.settings.get("welcome_text") or DEFAULT_WELCOME)
                return await self._canned(claim, "/start", welcome, None, "welcome")
            language = await self._language(claim, agent.default_language)
            if unheard is not None and unheard.kind == "audio":
                return await self._canned(
                    claim, VOICE_QUESTION, phrase("type_please", language), language, "voice"
                )
            return await self._canned(
                claim, MEDIA_QUESTION, phrase("text_only", language), language, "text_only"
            )
        question = "\n".join(questions)[-MAX_MESSAGE_CHARS:]
        rules = self._channels.get(first.channel)
        # The agent's own tag filters apply in the pipeline; a channel may have more.
        filters = channel_filters(agent.settings, first.channel)
        request = TurnRequest(
            agent=agent.slug,
            channel=first.channel,
            conversation_key=first.conversation_key,
            text=question,
            provider_message_id=claim.rows[-1].provider_message_id,
            language=None,
            writing_rule=rules.writing_rule if rules else None,
            voice=tuple(heard),
            include_tags=filters.include,
            exclude_tags=filters.exclude,
        )
        outcome = await self._pipeline.run(request, CollectingTurnOutput())
        if outcome.error is not None and not outcome.error_transient:
            # The model refused the request itself (a wrong key or model name...): no later
            # try gets another answer until staff mend it and take the message up again.
            raise ModelFailed(
                f"the answer could not be generated ({outcome.error}: {outcome.error_detail})",
                transient=False,
            )
        if outcome.error is not None:
            # The model failed or said nothing: it may well answer on a later try.
            raise Unavailable(f"the answer could not be generated ({outcome.error})")
        answered_in = None
        if outcome.sources:
            # The turn has just saved the conversation's language: the one the answer is in.
            answered_in = await self._conversations.language(
                agent.id, first.channel, first.conversation_key
            )
        return _Reply(
            outcome.answer,
            outcome.conversation_id,
            outcome.turn_id,
            outcome.sources,
            answered_in or agent.default_language,
            agent.site_url,
        )

    async def _acknowledge(self, first: InboxRow, receipts: Sequence[str]) -> None:
        """Tell the customer's app its button presses arrived (a courtesy: never fails)."""
        if not receipts or self._senders is None:
            return
        try:
            sender = await sender_of(self._senders, first.agent_id, first.channel)
        except Exception as exc:
            log.warning("inbox.acknowledge.unavailable channel=%s error=%r", first.channel, exc)
            return
        if not isinstance(sender, ChoiceSender):
            return
        for receipt in receipts:
            try:
                await sender.acknowledge(receipt)
            except Exception as exc:
                log.warning("inbox.acknowledge.failed channel=%s error=%r", first.channel, exc)

    async def _heard(self, first: InboxRow, voice: MediaItem) -> str:
        """The words of a voice note; '' when it can never be heard (gone from the provider,
        a format the model refuses): the customer is asked to type instead. A failure that
        may pass (a timeout, a service down) is raised, and the turn tried again."""
        if self._transcripts is None:
            return ""
        try:
            return await self._transcripts.transcript(first.agent_id, first.channel, voice)
        except (MediaUnavailable, ModelFailed) as exc:
            if exc.transient:
                raise
            log.warning(
                "inbox.voice.unheard channel=%s inbox_id=%d error=%r", first.channel, first.id, exc
            )
            return ""

    async def _remember_customer(self, first: InboxRow, messages: Sequence[InboundMessage]) -> None:
        """The customer's name and handle as their channel gives them, for staff."""
        name = next((m.display_name for m in reversed(messages) if m.display_name), None)
        handle = next((m.handle for m in reversed(messages) if m.handle), None)
        if name or handle:
            await self._conversations.remember_customer(
                first.agent_id, first.channel, first.conversation_key, name, handle
            )

    async def _canned(
        self, claim: InboxClaim, question: str, answer: str, language: str | None, kind: str
    ) -> _Reply:
        first = claim.first
        saved = await self._conversations.save_turn(
            TurnRecord(
                agent_id=first.agent_id,
                channel=first.channel,
                conversation_key=first.conversation_key,
                question=question,
                answer=answer,
                save_question=True,
                rewritten_query=None,
                confidence=None,
                low_confidence=False,
                mode="canned",
                trace={"canned": kind},
                language=language,
                count_usage=False,
            )
        )
        if self._memory is not None:
            await self._memory.remember(saved.conversation_id, saved.generation, saved.messages)
        return _Reply(answer, saved.conversation_id, saved.turn_id)

    async def _language(self, claim: InboxClaim, default: str) -> str:
        """The visitor's language: their app's (Telegram tells it), else the conversation's,
        else the agent's."""
        hint = claim.rows[-1].inbound.language_hint
        if hint:
            return _base_language(hint)
        known = await self._conversations.language(
            claim.first.agent_id, claim.first.channel, claim.first.conversation_key
        )
        return _base_language(str(known or default))

    async def _finish(self, claim: InboxClaim, reply: _Reply) -> None:
        """The reply's parts into the outbox and the rows done, together or not at all."""
        first = claim.first
        rules = self._channels.get(first.channel)
        made = (
            rules.reply_parts(reply.text, reply.sources, language=reply.language, site=reply.site)
            if rules
            else [reply.text]
        )
        parts = [p for p in made if p.strip()]
        if await self._superseded(claim, reply):
            if self._memory is not None and reply.conversation_id is not None:
                await self._memory.forget(reply.conversation_id)
            raise _Superseded()
        async with self._pool.acquire() as conn, conn.transaction():
            if not await complete(conn, claim):
                raise _LeaseLost()
            if reply.prompt is not None:
                await close_prompt(conn, reply.prompt)
            message_id = None
            if reply.turn_id is not None:
                message_id = await reply_message_id(conn, reply.turn_id)
            await enqueue(
                conn,
                agent_id=first.agent_id,
                channel=first.channel,
                recipient=first.conversation_key,
                parts=parts,
                conversation_id=reply.conversation_id,
                message_id=message_id,
            )

    async def _superseded(self, claim: InboxClaim, reply: _Reply) -> bool:
        """True (and the turn undone) when the visitor wrote again while the reply was made:
        it would answer only part of what they said, so everything is answered together in a
        new turn. The rows go back to waiting, under this worker's lease or not at all."""
        if not self._redo:
            return False
        async with self._pool.acquire() as conn, conn.transaction():
            if not await newer_waiting(conn, claim):
                return False
            if not await put_back(conn, claim):
                raise _LeaseLost()
            if reply.turn_id is not None:
                await discard_turn(conn, reply.turn_id)
        return True

    async def _release(self, claim: InboxClaim, exc: Exception) -> None:
        """The claimed rows back to waiting with back-off, or failed, as the error deserves."""
        first = claim.first
        kind = failure_kind(exc)
        attempts = max(r.attempts for r in claim.rows) + 1
        spent = kind == "unexpected" and attempts >= self._max_attempts
        retry = None if kind == "permanent" or spent else self._backoff
        try:
            failed = await self._leases.release(claim, str(exc) or repr(exc), retry)
        except Exception as again:
            # The rows stay leased; once the lease ends another try takes them.
            log.warning(
                "inbox.release.failed channel=%s inbox_id=%d error=%r turn_error=%r",
                first.channel,
                first.id,
                again,
                exc,
            )
            return
        # A bug (unexpected) is logged with its traceback, a service that is down without.
        log.log(
            logging.ERROR if kind == "unexpected" else logging.WARNING,
            "inbox.turn.failed channel=%s inbox_id=%d kind=%s attempts=%d given_up=%d error=%r",
            first.channel,
            first.id,
            kind,
            attempts,
            failed,
            exc,
            exc_info=exc if kind == "unexpected" else None,
        )

    # -- holding messages -----------------------------------------------------------------

    async def send_holding_messages(self) -> int:
        """Tell each customer waiting longer than ``holding_after`` seconds, once per turn,
        that the answer is delayed; the message is queued like a reply. Returns how many."""
        if self._holding_after <= 0:
            return 0
        sent = 0
        for conversation in await self._leases.overdue(self._holding_after):
            agent = await self._agents.by_id(conversation.agent_id)
            async with self._pool.acquire() as conn, conn.transaction():
                holding = await hold(conn, conversation, self._holding_after)
                if holding is None:
                    continue
                language = _holding_language(holding, agent.default_language)
                text = phrase("holding", language)
                rules = self._channels.get(conversation.channel)
                parts = rules.reply_parts(text, (), language=language) if rules else [text]
                await enqueue(
                    conn,
                    agent_id=conversation.agent_id,
                    channel=conversation.channel,
                    recipient=conversation.conversation_key,
                    parts=[p for p in parts if p.strip()],
                    conversation_id=holding.conversation_id,
                )
            sent += 1
            self._queued()
            log.info(
                "inbox.holding.queued channel=%s inbox_id=%d language=%s",
                conversation.channel,
                holding.rows[0].id,
                language,
            )
        return sent


async def _survived(step: str, work: Coroutine[Any, Any, object]) -> bool:
    """Run one step of the loop; False (and logged) when it failed, say on a lost database."""
    try:
        await work
    except Exception as exc:
        if failure_kind(exc) == "transient":
            log.warning("inbox.poll.failed step=%s error=%r", step, exc)
        else:
            log.exception("inbox.poll.failed step=%s", step)
        return False
    return True


def _holding_language(holding: Holding, default: str) -> str:
    """What the customer wrote in, else the conversation's language so far, else their
    Telegram setting, else the agent's."""
    messages = [row.inbound for row in holding.rows]
    written = "\n".join(m.text for m in messages if m.text and m.command is None)
    found = (detect_language(written) or guess_language(written)) if written else None
    if found:
        return found
    if holding.conversation_language:
        return holding.conversation_language
    hint = messages[-1].language_hint if messages else None
    return _base_language(hint) if hint else default


def _base_language(code: str) -> str:
    return code.replace("_", "-").split("-")[0].lower()
