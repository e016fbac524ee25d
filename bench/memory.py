"""Conversation memory: rebuilt from Postgres on a cache miss (12 messages + summary), p50/p99.

    .venv/bin/python -m bench.memory                          # 5000 conversations, embedded PG
    .venv/bin/python -m bench.memory --conversations 20000 --messages 80
    PARLEY_DATABASE_URL=postgresql://... .venv/bin/python -m bench.memory
    .venv/bin/python -m bench.memory --redis redis://127.0.0.1:6379/0   # Redis rows too

Every conversation gets ``--messages`` messages of mixed length and an eight-line summary; one in
five was cleared once, so its oldest messages belong to an older generation that memory must
skip. "miss" is the whole `ConversationMemory.recall` with nothing cached (a cache read, then one
query), which is what the turn waits for; the entries are then written back beside the turn,
timed on their own. "hit" is the same call answered by the cache; the in-process cache's hit is
the baseline. Conversations are read in random order, each once per pass.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
import uuid

import asyncpg
import redis.asyncio as aioredis

from bench.database import bench_settings
from bench.figures import record
from core.cache import LocalCache, RedisCache
from core.memory import ConversationMemory, Summarizer
from core.ports import Cache
from core.settings import Settings
from core.store import Agents, open_database
from core.store.memory import MemoryStore
from core.store.vector_index import EmbedderIdentity

TARGET_P99_MS = 5.0
IDENTITY = EmbedderIdentity("use:universal-sentence-encoder-multilingual-3", 512)
SUMMARY = "\n".join(
    [
        "Wants: to exchange the Fjord GTX boots (NK-2041) for size 44.",
        "Situation: ordered on 3 March, order 100-2231, lives in Ghent.",
        "Situation: the left boot leaks at the seam after two walks.",
        "Offered: a free exchange within 30 days with the returns form.",
        "Offered: a prepaid bpost label, sent by e-mail.",
        "Offered: a refund instead, within 5 working days.",
        "Wants: to know whether size 44 is in stock in blue.",
        "Open: when the blue size 44 is back in stock.",
    ]
)
WORDS = [
    "the", "boot", "order", "size", "exchange", "return", "refund", "parcel", "delivery",
    "Belgium", "blue", "brown", "leather", "waterproof", "label", "form", "stock", "week",
    "days", "euro", "shipping", "warehouse", "seam", "left", "right", "walk",
]  # fmt: skip


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _text(rng: random.Random) -> str:
    # Mostly short chat lines, now and then a long answer, as real conversations go.
    length = rng.choice([6, 10, 14, 20, 30, 45, 80])
    return " ".join(rng.choice(WORDS) for _ in range(length)).capitalize() + "."


async def _load(pool: asyncpg.Pool, agent_id: int, args: argparse.Namespace) -> list[int]:
    rng = random.Random(7)
    ids: list[int] = []
    batch = 1000
    for start in range(0, args.conversations, batch):
        size = min(batch, args.conversations - start)
        async with pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                """INSERT INTO conversations (agent_id, channel, conversation_key, generation)
                   SELECT $1, 'whatsapp', 'whatsapp:+316' || g, CASE WHEN g % 5 = 0 THEN 1 ELSE 0 END
                     FROM generate_series($2::int, $3::int) g ORDER BY g
                   RETURNING id, generation""",
                agent_id,
                start,
                start + size - 1,
            )
            records = []
            for row in rows:
                cleared_before = 10 if row["generation"] else 0
                for number in range(args.messages):
                    generation = 0 if number < cleared_before else row["generation"]
                    role = "visitor" if number % 2 == 0 else "assistant"
                    records.append((row["id"], role, _text(rng), generation))
            await conn.copy_records_to_table(
                "messages",
                columns=["conversation_id", "role", "text", "generation"],
                records=records,
            )
            # The summary covers what has left the last twelve, as after a real turn.
            await conn.execute(
                """INSERT INTO summaries (conversation_id, text, through_message, generation)
                   SELECT c.id, $2, m.through, c.generation
                     FROM conversations c
                     JOIN LATERAL (SELECT id AS through FROM messages
                                    WHERE conversation_id = c.id AND generation = c.generation
                                    ORDER BY id DESC OFFSET 12 LIMIT 1) m ON true
                    WHERE c.id = ANY($1::bigint[])""",
                [r["id"] for r in rows],
                SUMMARY,
            )
            ids += [r["id"] for r in rows]
        print(f"\r  loaded {start + size:,} / {args.conversations:,} conversations", end="")
    print()
    return ids


async def _pass(
    memory: ConversationMemory, ids: list[int], expect: str, written: list[float] | None = None
) -> list[float]:
    """Times each `recall`; with ``written``, also the cache write-back a miss starts, which
    runs beside the turn (here waited for after each read, so as not to blur the next one)."""
    timings = []
    for conversation_id in ids:
        started = time.perf_counter()
        recollection = await memory.recall(conversation_id)
        timings.append((time.perf_counter() - started) * 1000)
        if written is not None:
            started = time.perf_counter()
            await memory.drain()
            written.append((time.perf_counter() - started) * 1000)
        assert recollection.source == expect, (recollection.source, expect)
        assert len(recollection.messages) == 12
        assert recollection.summary
    return timings


def _row(name: str, timings: list[float]) -> tuple[str, ...]:
    return (
        name,
        f"{statistics.median(timings):.3f}",
        f"{_percentile(timings, 99):.3f}",
        f"{max(timings):.3f}",
        str(len(timings)),
    )


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
        if number == 0:
            print("  ".join("-" * w for w in widths))


async def _measure(
    pool: asyncpg.Pool, ids: list[int], cache: Cache, label: str, rounds: int
) -> list[tuple[str, ...]]:
    misses: list[float] = []
    written: list[float] = []
    hits: list[float] = []
    for number in range(rounds):
        order = random.Random(number).sample(ids, len(ids))
        # A new memory per round over an emptied cache: every first read is a miss.
        memory = ConversationMemory(MemoryStore(pool), cache, Summarizer(None))
        for conversation_id in order:
            await memory.forget(conversation_id)
        misses += await _pass(memory, order, "postgres", written)
        hits += await _pass(memory, order, "cache")
    return [
        _row(f"miss: rebuild from Postgres ({label})", misses),
        _row(f"  then cached, beside the turn ({label})", written),
        _row(f"hit ({label})", hits),
    ]


async def _run(args: argparse.Namespace, settings: Settings) -> None:
    database = await open_database(settings, max_size=4)
    pool = database.pool
    agent = await Agents(pool).create("bench", embedder=IDENTITY)
    print(f"loading {args.conversations:,} conversations of {args.messages} messages")
    ids = await _load(pool, agent.id, args)
    await pool.execute("VACUUM ANALYZE")
    store = MemoryStore(pool)
    for conversation_id in ids[:200]:  # warm the pool's prepared statements and the buffers
        await store.load(conversation_id, 12)

    query = []
    for conversation_id in random.Random(1).sample(ids, len(ids)):
        started = time.perf_counter()
        await store.load(conversation_id, 12)
        query.append((time.perf_counter() - started) * 1000)
    rows = [("measure", "p50 ms", "p99 ms", "max ms", "n"), _row("the query alone", query)]
    rows += await _measure(pool, ids, LocalCache(), "in-process cache", args.rounds)
    redis_url = args.redis or os.environ.get("PARLEY_REDIS_URL")
    if redis_url:
        prefix = f"bench-{uuid.uuid4().hex[:8]}:"
        cache = RedisCache(aioredis.Redis.from_url(redis_url, decode_responses=True), prefix)
        try:
            rows += await _measure(pool, ids, cache, "Redis", args.rounds)
        finally:
            client = aioredis.Redis.from_url(redis_url, decode_responses=True)
            keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()
            await cache.close()
    print()
    print(
        f"conversations {args.conversations:,}  messages each {args.messages}  "
        f"rounds {args.rounds}  (12 recent messages + an 8-line summary per read)"
    )
    _table(rows)
    query_p50, query_p99 = float(rows[1][1]), float(rows[1][2])
    for row in rows[2:]:
        if row[0].startswith("miss"):
            label = row[0].partition("(")[2].rstrip(")")
            record(f"rebuild p50 ({label})", float(row[1]), "ms", floor=query_p50)
            record(f"rebuild p99 ({label})", float(row[2]), "ms", floor=query_p99,
                   aim=("<", TARGET_P99_MS))  # fmt: skip
    print(f"\naim: p99 of a rebuild under {TARGET_P99_MS:.0f} ms")
    for row in rows:
        if row[0].startswith("miss"):
            verdict = "met" if float(row[2]) < TARGET_P99_MS else "MISSED"
            print(f"  {row[0]}: p99 {row[2]} ms, {verdict}")
    load = os.getloadavg()[0]
    print(f"(load average {load:.1f} on {os.cpu_count()} CPUs while measuring)")
    await database.close()


async def main(args: argparse.Namespace) -> None:
    async with bench_settings() as settings:
        await _run(args, settings)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=5000)
    parser.add_argument("--messages", type=int, default=40, help="per conversation (>= 24)")
    parser.add_argument("--rounds", type=int, default=2, help="miss + hit passes over all")
    parser.add_argument("--redis", help="also measure with this Redis (or PARLEY_REDIS_URL)")
    arguments = parser.parse_args()
    if arguments.messages < 24:
        parser.error("--messages: at least 24, so that a cleared conversation still has a summary")
    asyncio.run(main(arguments))
