"""Retrieval at scale: N synthetic chunks, p50/p99 of a full retrieve, HNSW recall@10.

    .venv/bin/python -m bench.retrieval                 # 100k chunks, embedded PostgreSQL
    .venv/bin/python -m bench.retrieval --n 1000000     # a million
    PARLEY_DATABASE_URL=postgresql://... .venv/bin/python -m bench.retrieval

Vectors are drawn around a few thousand topic centres (real content clusters like this), texts
from a vocabulary with topic words, so both the ANN and the full-text side do real work.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg
import numpy as np

from bench.database import bench_settings
from core.cache import LocalCache
from core.retrieval.embedders import UseEmbedder
from core.retrieval.retriever import RetrievalQuery, Retriever
from core.settings import Settings
from core.store import Agents, open_database
from core.store.search import ChunkSearch, SearchFilters
from core.store.vector_index import (
    HNSW_EF_CONSTRUCTION,
    HNSW_M,
    EmbedderIdentity,
    bind_embedder,
    index_name,
)

DIM = 512
IDENTITY = EmbedderIdentity("use:universal-sentence-encoder-multilingual-3", DIM)


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


class Corpus:
    def __init__(self, n: int, topics: int, seed: int = 7) -> None:
        self.rng = np.random.default_rng(seed)
        self.n = n
        self.centres = _unit(self.rng.normal(size=(topics, DIM)))
        self.vocabulary = np.array([f"w{i}" for i in range(20000)])

    def batch(self, start: int, size: int) -> tuple[np.ndarray, list[str]]:
        topics = self.rng.integers(0, len(self.centres), size)
        vectors = _unit(self.centres[topics] + self.rng.normal(size=(size, DIM)) / np.sqrt(DIM))
        words = self.vocabulary[self.rng.integers(0, len(self.vocabulary), (size, 60))]
        texts = [
            f"topic{t} {' '.join(row)} subject{t}" for t, row in zip(topics, words, strict=True)
        ]
        return vectors, texts

    def queries(self, count: int) -> tuple[np.ndarray, list[str]]:
        topics = self.rng.integers(0, len(self.centres), count)
        vectors = _unit(self.centres[topics] + self.rng.normal(size=(count, DIM)) / np.sqrt(DIM))
        texts = [
            f"question {i} about topic{t} w{int(self.rng.integers(0, 20000))}"
            for i, t in enumerate(topics)
        ]
        return vectors, texts


async def _load(pool: asyncpg.Pool, agent_id: int, corpus: Corpus) -> None:
    source = await pool.fetchval(
        "INSERT INTO sources (agent_id, kind, location) VALUES ($1, 'text', 'bench') RETURNING id",
        agent_id,
    )
    batch = 5000
    for start in range(0, corpus.n, batch):
        size = min(batch, corpus.n - start)
        vectors, texts = corpus.batch(start, size)
        async with pool.acquire() as conn, conn.transaction():
            # Ten chunks to a page, like a real site's longer pages.
            page_ids = await conn.fetch(
                """INSERT INTO pages (agent_id, source_id, url, title, locale, content_hash)
                   SELECT $1, $2, '/p/' || g, 'Page ' || g, 'en', '\\x00'
                     FROM generate_series($3::int, $4::int) g ORDER BY g RETURNING id""",
                agent_id,
                source,
                start // 10,
                (start + size - 1) // 10,
            )
            pages = [r["id"] for r in page_ids]
            await conn.copy_records_to_table(
                "chunks",
                columns=[
                    "agent_id",
                    "page_id",
                    "ord",
                    "heading",
                    "text",
                    "locale",
                    "embedding",
                    "folder_language",
                ],
                records=[
                    (
                        agent_id,
                        pages[i // 10 - start // 10],
                        i % 10,
                        "Page",
                        texts[i - start],
                        "en",
                        vectors[i - start],
                        None,
                    )
                    for i in range(start, start + size)
                ],
            )
        print(f"\r  loaded {start + size:,} / {corpus.n:,} chunks", end="", flush=True)
    print()


async def _exact(pool: asyncpg.Pool, agent_id: int, vector: np.ndarray, k: int) -> list[int]:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_indexscan = off")
        rows = await conn.fetch(
            f"SELECT id FROM chunks WHERE agent_id = $1 "
            f"ORDER BY embedding::vector({DIM}) <=> $2 LIMIT $3",
            agent_id,
            vector,
            k,
        )
    return [r["id"] for r in rows]


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
        if number == 0:
            print("  ".join("-" * w for w in widths))


async def main(args: argparse.Namespace) -> None:
    async with bench_settings() as settings:
        await _run(args, settings)


async def _run(args: argparse.Namespace, settings: Settings) -> None:
    database = await open_database(settings, max_size=4)
    pool = database.pool
    agent = await Agents(pool).create("bench", embedder=IDENTITY)
    corpus = Corpus(args.n, topics=max(50, args.n // 50))
    print(f"loading {args.n:,} synthetic {DIM}-dim chunks")
    await pool.execute(f"DROP INDEX {index_name(agent.id)}")
    started = time.perf_counter()
    await _load(pool, agent.id, corpus)
    load_s = time.perf_counter() - started
    async with pool.acquire() as conn:
        await conn.execute("SET maintenance_work_mem = '8GB'")
        await conn.execute("SET max_parallel_maintenance_workers = 1")
        started = time.perf_counter()
        await bind_embedder(conn, agent.id, IDENTITY)
        build_s = time.perf_counter() - started
        await conn.execute("VACUUM ANALYZE chunks")
    agent = await Agents(pool).get("bench")

    vectors, texts = corpus.queries(args.queries)
    search = ChunkSearch(pool)
    retriever = Retriever(search, UseEmbedder(), LocalCache())
    filters = SearchFilters()

    for vector, text in zip(vectors[:10], texts[:10], strict=True):  # warm caches
        await retriever.retrieve(
            RetrievalQuery(agent=agent, text="warm " + text, reply_language="en"), vector
        )

    ann_ms, full_ms, recalls = [], [], []
    for i, (vector, text) in enumerate(zip(vectors, texts, strict=True)):
        t = time.perf_counter()
        ann = await search.dense(agent.id, DIM, vector, args.k, filters)
        ann_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        await retriever.retrieve(
            RetrievalQuery(agent=agent, text=text, k=args.k, reply_language="en"), vector
        )
        full_ms.append((time.perf_counter() - t) * 1000)
        if i < args.recall_queries:
            exact = await _exact(pool, agent.id, vector, args.k)
            recalls.append(len({c.chunk_id for c in ann} & set(exact)) / len(exact))

    embedder = UseEmbedder()
    await embedder.embed(["warm up"])
    embed_ms = []
    for text in [
        "How long does delivery to Belgium take?",
        "Wat kost verzending?",
        "Rücksendung Kosten",
    ] * 10:
        t = time.perf_counter()
        await embedder.embed([text])
        embed_ms.append((time.perf_counter() - t) * 1000)

    print()
    print(
        f"chunks {args.n:,}  dim {DIM}  HNSW m={HNSW_M} ef_construction={HNSW_EF_CONSTRUCTION} "
        f"ef_search=max(100, 2*limit)  load {load_s:.1f} s  index build {build_s:.1f} s"
    )
    rows = [("measure", "p50 ms", "p99 ms", "n")]
    rows.append(
        (
            "ANN top-k (SQL)",
            f"{statistics.median(ann_ms):.2f}",
            f"{_percentile(ann_ms, 99):.2f}",
            str(len(ann_ms)),
        )
    )
    rows.append(
        (
            "full retrieve (ANN+FTS+fusion+gate)",
            f"{statistics.median(full_ms):.2f}",
            f"{_percentile(full_ms, 99):.2f}",
            str(len(full_ms)),
        )
    )
    rows.append(
        (
            "question embedding (USE)",
            f"{statistics.median(embed_ms):.2f}",
            f"{_percentile(embed_ms, 99):.2f}",
            str(len(embed_ms)),
        )
    )
    _table(rows)
    print(
        f"\nrecall@{args.k} of the HNSW path against an exact scan: {statistics.mean(recalls):.3f} "
        f"over {len(recalls)} queries"
    )
    await database.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000, help="synthetic chunks (default 100000)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--recall-queries", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    asyncio.run(main(parser.parse_args()))
