"""Claiming inbox conversations: who is ready, who waits, and that a backlog cannot starve anyone."""

from __future__ import annotations

import asyncio

from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.inbox import ConversationRef, Inbox, InboxLeases, complete, hold
from core.store.vector_index import EmbedderIdentity
from tests.support.deliveries import add_delivery

CHATTY = "whatsapp:+31600000001"
QUIET = "whatsapp:+31600000002"


async def _deliver(database: Database, agent_id: int, key: str, count: int, age: float) -> None:
    inbox = Inbox(database.pool)
    for _ in range(count):
        number = await database.pool.fetchval("SELECT count(*) FROM inbox")
        await add_delivery(inbox, agent_id, "whatsapp", f"SM{number:032d}", key, {"Body": "hello"})
    await database.pool.execute(
        """UPDATE inbox SET received_at = now() - make_interval(secs => $2)
            WHERE conversation_key = $1 AND status = 'pending'""",
        key,
        age,
    )


async def test_a_busy_conversations_backlog_does_not_hide_a_ready_one(
    database: Database, use_embedder: UseEmbedder
) -> None:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    leases = InboxLeases(database.pool)
    await _deliver(database, agent.id, CHATTY, 1, age=60)
    first = await leases.claim(quiet_for=2, lease=60, max_rows=20)
    assert first is not None
    assert first.first.conversation_key == CHATTY
    # While its answer is made, the chatty customer sends far more than one claim looks at.
    await _deliver(database, agent.id, CHATTY, 120, age=30)
    await _deliver(database, agent.id, QUIET, 1, age=10)

    second = await leases.claim(quiet_for=2, lease=60, max_rows=20)
    assert second is not None
    assert [row.conversation_key for row in second.rows] == [QUIET]
    assert await leases.claim(quiet_for=2, lease=60, max_rows=20) is None  # chatty is busy


async def test_a_conversation_still_typing_waits_and_an_expired_lease_is_taken_again(
    database: Database, use_embedder: UseEmbedder
) -> None:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    leases = InboxLeases(database.pool)
    await _deliver(database, agent.id, CHATTY, 3, age=60)
    await _deliver(database, agent.id, QUIET, 1, age=0)  # within the burst window
    claim = await leases.claim(quiet_for=2, lease=60, max_rows=20)
    assert claim is not None
    assert len(claim.rows) == 3
    assert await leases.claim(quiet_for=2, lease=60, max_rows=20) is None

    await database.pool.execute(  # the worker holding the chatty rows died long ago
        "UPDATE inbox SET lease_until = now() - interval '1 second' WHERE status = 'processing'"
    )
    again = await leases.claim(quiet_for=2, lease=60, max_rows=20)
    assert again is not None
    assert again.ids == claim.ids
    assert await leases.renew(claim, 60) is None  # the old holder's lease is no good any more


async def test_no_holding_message_for_messages_answered_while_it_was_being_decided(
    database: Database, use_embedder: UseEmbedder
) -> None:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    await _deliver(database, agent.id, CHATTY, 1, age=60)
    claim = await InboxLeases(database.pool).claim(quiet_for=2, lease=60, max_rows=20)
    assert claim is not None
    conversation = ConversationRef(agent.id, "whatsapp", CHATTY)

    async def decide() -> object:
        async with database.pool.acquire() as conn, conn.transaction():
            return await hold(conn, conversation, after=30)

    async with database.pool.acquire() as answering:
        finishing = answering.transaction()
        await finishing.start()
        assert await complete(answering, claim)  # the answer is being committed ...
        # ... while the holding message is decided: the rows still look open to it, and its
        # marking waits for the answer's transaction to end.
        deciding = asyncio.create_task(decide())
        async with asyncio.timeout(10):
            while not await database.pool.fetchval(
                """SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND wait_event_type = 'Lock'"""
            ):
                await asyncio.sleep(0.01)
        await finishing.commit()
    # Answered meanwhile: no holding message may follow the answer.
    assert await deciding is None
