"""A burst of webhooks into the inbox: each delivery stored once, a bad one failing alone."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from core.inbound import InboundMessage
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.inbox import Inbox
from core.store.vector_index import EmbedderIdentity


def _message(number: int, customer: int) -> InboundMessage:
    return InboundMessage(
        customer_id=f"whatsapp:+316{customer:08d}",
        provider_message_id=f"SM{number:032d}",
        text=f"Question {number}",
        display_name="Customer",
    )


async def test_a_burst_stores_each_delivery_once_and_says_which_were_new(
    database: Database, use_embedder: UseEmbedder
) -> None:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    inbox = Inbox(database.pool)
    assert await inbox.add(agent.id, "whatsapp", _message(1, 1), {"Body": "Question 1"})

    # 300 at once, from 100 customers: the provider re-delivers ten of them in the same burst,
    # and one that was stored before.
    burst = [_message(n, n % 100) for n in range(2, 302)]
    burst += [_message(n, n % 100) for n in range(2, 12)] + [_message(1, 1)]
    added = await asyncio.gather(
        *(inbox.add(agent.id, "whatsapp", m, {"Body": m.text}) for m in burst)
    )

    assert sum(added) == 300
    assert not any(added[300:])  # the re-deliveries
    rows = await inbox.rows(agent.id, "whatsapp")
    assert sorted(r.provider_message_id for r in rows) == [f"SM{n:032d}" for n in range(1, 302)]
    stored = {r.provider_message_id: r for r in rows}
    for message in burst[:300]:
        row = stored[message.provider_message_id]
        assert (row.conversation_key, row.inbound) == (message.customer_id, message)
        assert row.payload == {"Body": message.text}
    # Deliveries that came together went in together: far fewer commits than rows.
    assert len({r.received_at for r in rows}) < len(rows) / 4


async def test_a_delivery_the_database_refuses_fails_alone(
    database: Database, use_embedder: UseEmbedder
) -> None:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    inbox = Inbox(database.pool)
    gone = agent.id + 1000  # an agent deleted as its webhook came in
    calls = [
        inbox.add(gone if n == 50 else agent.id, "telegram", _message(n, n), {"update_id": n})
        for n in range(100)
    ]
    results = await asyncio.gather(*calls, return_exceptions=True)

    assert isinstance(results[50], asyncpg.ForeignKeyViolationError)
    assert all(r is True for n, r in enumerate(results) if n != 50)
    assert await inbox.count(agent.id, "telegram") == 99


@pytest.mark.parametrize("fillers", [0, 8], ids=["side by side", "in one statement"])
async def test_a_delivery_sent_again_while_the_first_is_written_is_a_duplicate(
    database: Database, use_embedder: UseEmbedder, fillers: int
) -> None:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    inbox = Inbox(database.pool)
    # With other deliveries ahead of them, the copies wait and are written by one statement.
    ahead = [_message(n, n) for n in range(100, 100 + fillers)]
    message = _message(7, 7)
    added = await asyncio.gather(
        *(inbox.add(agent.id, "whatsapp", m, {"n": -1}) for m in ahead),
        *(inbox.add(agent.id, "whatsapp", message, {"n": i}) for i in range(3)),
    )
    copies = added[fillers:]
    assert sorted(copies) == [False, False, True]
    rows = {r.provider_message_id: r for r in await inbox.rows(agent.id, "whatsapp")}
    assert len(rows) == fillers + 1
    assert rows[message.provider_message_id].payload == {"n": copies.index(True)}
