"""`ConversationMemory`: a conversation's recent messages and summary, cached, rebuilt on a miss.

Cache layout (every entry expires after ``ttl``, two hours by default)::

    memory:{conversation}                 the conversation's current generation
    memory:{conversation}:{gen}:messages  the last messages of that generation, as JSON items
    memory:{conversation}:{gen}:summary   {"text", "through"} of that generation (text may be null)

Entries of a generation are only ever read through the pointer, so whatever is written for an
old generation after a clear (a slow rebuild, a late summary) is never seen again. A miss of
any of the three rebuilds all of them from Postgres in one query. The cache never fails a call
(see `core.cache.FallbackCache`): while Redis is down every recall is such a rebuild.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Literal

import asyncpg

from core.memory.summary import Summarizer
from core.ports import Cache, ChatModel
from core.settings import Settings
from core.store.conversations import StoredMessage
from core.store.memory import MemoryStore, StoredMemory

log = logging.getLogger(__name__)

WINDOW = 12  # messages kept word for word
SUMMARY_LAG = 6  # messages out of the window, beyond the summary, before it is updated
TTL = 2 * 60 * 60


@dataclass(frozen=True, slots=True)
class Recollection:
    """What a turn knows of the conversation before it: recent messages and a summary."""

    conversation_id: int | None
    generation: int = 0
    messages: tuple[StoredMessage, ...] = ()
    summary: str | None = None
    through: int | None = None  # the last message id the summary covers
    source: Literal["cache", "postgres", "none"] = "none"

    @property
    def history(self) -> list[tuple[str, str]]:
        """(role, text) of the recent messages, oldest first, as the prompt takes them."""
        return [(m.role, m.text) for m in self.messages]

    def describe(self) -> dict[str, Any]:
        """For the turn's trace: where memory came from and how much of it there was."""
        return {
            "source": self.source,
            "generation": self.generation,
            "messages": len(self.messages),
            "summary": self.summary is not None,
        }


def _pointer(conversation_id: int) -> str:
    return f"memory:{conversation_id}"


def _messages_key(conversation_id: int, generation: int) -> str:
    return f"memory:{conversation_id}:{generation}:messages"


def _summary_key(conversation_id: int, generation: int) -> str:
    return f"memory:{conversation_id}:{generation}:summary"


def _item(message: StoredMessage) -> str:
    return json.dumps({"id": message.id, "role": message.role, "text": message.text})


def _summary_value(summary: str | None, through: int | None) -> str:
    return json.dumps({"text": summary, "through": through})


class ConversationMemory:
    """Recent messages word for word plus a summary of what came before, per conversation.

    Each answered turn is appended (`remember`); once ``lag`` more messages have left the
    last ``window`` than the summary covers, the summary is brought up to date in a task of
    its own, after the reply; the conversation's topic is written the same way after its
    first exchange, and a rebuilt memory is written back to the cache. `drain` waits for
    those tasks (at shutdown, in tests).
    """

    def __init__(
        self,
        store: MemoryStore,
        cache: Cache,
        summarizer: Summarizer,
        *,
        window: int = WINDOW,
        lag: int = SUMMARY_LAG,
        ttl: float = TTL,
    ) -> None:
        self._store = store
        self._cache = cache
        self._summarizer = summarizer
        self._window = window
        self._lag = lag
        self._ttl = ttl
        self._tasks: set[asyncio.Task[None]] = set()
        self._writing: dict[int, asyncio.Task[None]] = {}
        self._summarizing: set[int] = set()
        self._again: set[int] = set()

    @property
    def store(self) -> MemoryStore:
        return self._store

    async def recall(self, conversation_id: int | None) -> Recollection:
        """The conversation's memory: from the cache, else rebuilt from Postgres and cached."""
        if conversation_id is None:
            return Recollection(None)
        cached = await self._cached(conversation_id)
        if cached is not None:
            return cached
        return await self._rebuild(conversation_id)

    async def remember(
        self, conversation_id: int, generation: int, messages: Sequence[StoredMessage]
    ) -> None:
        """Add just-saved messages, then, in the background, name the conversation after its
        first exchange and update the summary when it is due.

        Only a cached list is extended: a list made from a few new messages would pass for
        the whole conversation, so without one the next `recall` rebuilds from Postgres.
        """
        writing = self._writing.get(conversation_id)
        if writing is not None:
            await asyncio.wait({writing})  # the rebuilt list first, then what came after it
        if messages:
            key = _messages_key(conversation_id, generation)
            if await self._cache.list_range(key):
                await self._cache.list_push(
                    key, *map(_item, messages), keep=self._window, ttl=self._ttl
                )
        self._summarize_soon(conversation_id)

    async def forget(self, conversation_id: int) -> None:
        """Drop the cached memory (e.g. after a turn was taken back); Postgres is unchanged."""
        pointer = await self._cache.get(_pointer(conversation_id))
        keys = [_pointer(conversation_id)]
        if pointer is not None:
            generation = int(pointer)
            keys += [
                _messages_key(conversation_id, generation),
                _summary_key(conversation_id, generation),
            ]
        await self._cache.delete(*keys)

    async def clear(self, agent_id: int, channel: str, conversation_key: str) -> bool:
        """Clear the conversation: memory starts empty; False when there is no such one.

        The stored messages stay for staff. A summary still being written is discarded.
        """
        cleared = await self._store.clear(agent_id, channel, conversation_key)
        if cleared is None:
            return False
        conversation_id, generation = cleared
        # Overwritten, not deleted: a rebuild that read Postgres before the clear only sets
        # the pointer when it is absent, so it cannot bring the old generation back.
        await self._cache.set(_pointer(conversation_id), str(generation), ttl=self._ttl)
        await self._cache.delete(
            _messages_key(conversation_id, generation - 1),
            _summary_key(conversation_id, generation - 1),
        )
        log.info("memory.cleared conversation_id=%d generation=%d", conversation_id, generation)
        return True

    async def summarize_if_due(self, conversation_id: int) -> bool:
        """Bring the summary up to date now if it is due; True when a summary was written."""
        work = await self._store.summary_work(conversation_id, self._window, self._lag)
        if work is None or not work.fallen_out:
            return False
        summary = await self._summarizer.summarize(work.previous, work.fallen_out)
        through = work.fallen_out[-1].id
        if not await self._store.save_summary(
            conversation_id, work.generation, summary.text, through
        ):
            log.info("memory.summary.discarded conversation_id=%d", conversation_id)
            return False
        await self._cache_summary(conversation_id, work.generation, summary.text, through)
        log.info(
            "memory.summary.written conversation_id=%d method=%s messages=%d",
            conversation_id,
            summary.method,
            len(work.fallen_out),
        )
        return True

    async def name_if_due(self, conversation_id: int) -> bool:
        """Write the conversation's topic once its first exchange is stored; True when written.

        Once per conversation: a topic stays, through clears too.
        """
        work = await self._store.topic_work(conversation_id)
        if work is None:
            return False
        topic = await self._summarizer.topic(work.question, work.answer, work.language)
        if not await self._store.save_topic(conversation_id, topic.text):
            return False  # named meanwhile, by another process
        log.info("memory.topic.written conversation_id=%d method=%s", conversation_id, topic.method)
        return True

    async def behind(self, *, limit: int, active_since: datetime | None = None) -> list[int]:
        """Conversations whose summary is due, quietest first (see `catch_up_summaries`)."""
        return await self._store.behind(
            self._window, self._lag, limit=limit, active_since=active_since
        )

    async def drain(self, within: float | None = None) -> None:
        """Wait for summaries and topics being written; after ``within`` seconds the rest is
        cancelled (the catch-up job writes the summaries later, the next turn the topic)."""
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        while self._tasks:
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            _, left = await asyncio.wait(set(self._tasks), timeout=timeout)
            if left:
                for task in left:
                    task.cancel()
                await asyncio.gather(*left, return_exceptions=True)
                return

    # -- cache ----------------------------------------------------------------------------

    async def _cached(self, conversation_id: int) -> Recollection | None:
        pointer = await self._cache.get(_pointer(conversation_id))
        if pointer is None:
            return None
        generation = int(pointer)
        items = await self._cache.list_range(_messages_key(conversation_id, generation))
        if not items:
            return None
        summary = await self._cache.get(_summary_key(conversation_id, generation))
        if summary is None:
            return None
        # Ids order the items and drop repeats that concurrent writers may have left.
        by_id = {}
        for raw in items:
            item = json.loads(raw)
            by_id[item["id"]] = StoredMessage(item["id"], item["role"], item["text"])
        messages = tuple(by_id[i] for i in sorted(by_id)[-self._window :])
        state = json.loads(summary)
        return Recollection(
            conversation_id, generation, messages, state["text"], state["through"], "cache"
        )

    async def _rebuild(self, conversation_id: int) -> Recollection:
        stored = await self._store.load(conversation_id, self._window)
        if stored is None:
            return Recollection(conversation_id)
        recollection = Recollection(
            conversation_id,
            stored.generation,
            stored.messages,
            stored.summary,
            stored.through,
            "postgres",
        )
        # Cached while the turn goes on: `remember` waits for it before adding to it.
        task = asyncio.create_task(self._write(conversation_id, stored))
        self._writing[conversation_id] = task
        self._tasks.add(task)
        task.add_done_callback(partial(self._written, conversation_id))
        return recollection

    def _written(self, conversation_id: int, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._writing.get(conversation_id) is task:
            del self._writing[conversation_id]

    async def _write(self, conversation_id: int, stored: StoredMemory) -> None:
        generation = stored.generation
        await self._cache.set(
            _pointer(conversation_id), str(generation), ttl=self._ttl, only_if_absent=True
        )
        # Keeping only as many items as are pushed replaces the list whole, in one round trip:
        # what was there may hold a message since taken back.
        await self._cache.list_push(
            _messages_key(conversation_id, generation),
            *map(_item, stored.messages),
            keep=len(stored.messages),
            ttl=self._ttl,
        )
        # A summary written while this rebuild read Postgres is newer than what it read.
        await self._cache.set(
            _summary_key(conversation_id, generation),
            _summary_value(stored.summary, stored.through),
            ttl=self._ttl,
            only_if_absent=True,
        )

    async def _cache_summary(
        self, conversation_id: int, generation: int, text: str, through: int
    ) -> None:
        key = _summary_key(conversation_id, generation)
        current = await self._cache.get(key)
        if current is not None and (json.loads(current)["through"] or 0) >= through:
            return  # a newer summary got there first
        await self._cache.set(key, _summary_value(text, through), ttl=self._ttl)

    # -- background summaries -------------------------------------------------------------

    def _summarize_soon(self, conversation_id: int) -> None:
        if conversation_id in self._summarizing:
            self._again.add(conversation_id)  # the running task looks once more when done
            return
        self._summarizing.add(conversation_id)
        task = asyncio.create_task(self._summarize_task(conversation_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _summarize_task(self, conversation_id: int) -> None:
        try:
            while True:
                self._again.discard(conversation_id)
                try:
                    await self.name_if_due(conversation_id)
                except Exception as exc:
                    # Reported once, here; the next turn of the conversation tries again.
                    log.warning(
                        "memory.topic.failed conversation_id=%d error=%r", conversation_id, exc
                    )
                try:
                    await self.summarize_if_due(conversation_id)
                except Exception as exc:
                    # Nobody awaits this task: the failure is reported here, once, and the
                    # catch-up job writes the summary later.
                    log.warning(
                        "memory.summary.failed conversation_id=%d error=%r", conversation_id, exc
                    )
                    return
                if conversation_id not in self._again:
                    return
        finally:
            self._summarizing.discard(conversation_id)
            self._again.discard(conversation_id)


def build_memory(
    settings: Settings, pool: asyncpg.Pool, cache: Cache, chat: ChatModel | None
) -> ConversationMemory:
    """The memory every pipeline (and the summary catch-up job) works with."""
    summarizer = Summarizer(
        chat,
        model=settings.summary_model or settings.rewrite_model,
        timeout_ms=round(settings.llm_timeouts.summary * 1000),
    )
    return ConversationMemory(MemoryStore(pool), cache, summarizer)


async def catch_up_summaries(
    memory: ConversationMemory, *, limit: int = 500, active_since: datetime | None = None
) -> int:
    """Bring every summary that has fallen behind up to date; returns how many were written.

    A summary is behind when six or more messages have left a conversation's last twelve
    without being summarised: normally it is updated right after the turn, but a process that
    stopped first leaves it behind. Checks at most ``limit`` conversations (quietest first),
    only those with a message since ``active_since`` when given. Safe to run in several
    processes at once: each write is conditional, so a conversation is never summarised
    backwards and a cleared one never gets its old summary back.
    """
    written = 0
    for conversation_id in await memory.behind(limit=limit, active_since=active_since):
        if await memory.summarize_if_due(conversation_id):
            written += 1
    return written
