"""Retrieval at scale: N synthetic chunks, p50/p99 of a full retrieve, HNSW recall@k.

    .venv/bin/python -m bench.retrieval                 # 100k chunks, embedded PostgreSQL
    .venv/bin/python -m bench.retrieval --n 1000000     # a million
    PARLEY_DATABASE_URL=postgresql://... .venv/bin/python -m bench.retrieval

    # keep the loaded table in database rx100k of PARLEY_DATABASE_URL's server and reuse it
    # (the index too, unless its build parameters differ or --rebuild); three query phases
    PARLEY_DATABASE_URL=postgresql://... .venv/bin/python -m bench.retrieval --keep rx100k --runs 3

Vectors are drawn around a few thousand topic centres (real content clusters like this), texts
from a vocabulary with topic words, so both the ANN and the full-text side do real work. Every
chunk carries one of 50 tags, so a query filtered on one tag keeps 2% of the rows.

Printed beside our ANN (ChunkSearch.dense: filters, page join, every column) is its floor: the
plain `ORDER BY embedding <=> q LIMIT k` pgvector query on the same index and settings. Recall
is measured against an exact scan of the same table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import numpy as np
from pgvector.asyncpg import register_vector

from bench.database import bench_settings
from bench.figures import record
from core.cache import LocalCache
from core.retrieval.embedders import UseEmbedder
from core.retrieval.retriever import RetrievalQuery, Retriever
from core.settings import Settings
from core.store import Agents, open_database
from core.store.agents import Agent
from core.store.search import ChunkSearch, SearchFilters
from core.store.vector_index import (
    EF_SEARCH,
    HNSW_EF_CONSTRUCTION,
    HNSW_M,
    MAX_SCAN_TUPLES,
    BuildProgress,
    EfSearch,
    EmbedderIdentity,
    HnswBuild,
    bind_embedder,
    build_progress,
    hnsw_session,
    index_name,
)

DIM = 512
IDENTITY = EmbedderIdentity("use:universal-sentence-encoder-multilingual-3", DIM)
TAGS = 50
PROGRESS_EVERY = 5.0  # seconds between index build progress lines


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
        # A generator of its own: the same questions whether or not the table was loaded now.
        rng = np.random.default_rng(self.n)
        topics = rng.integers(0, len(self.centres), count)
        vectors = _unit(self.centres[topics] + rng.normal(size=(count, DIM)) / np.sqrt(DIM))
        texts = [
            f"question {i} about topic{t} w{int(rng.integers(0, 20000))}"
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
                    "tags",
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
                        [f"t{i % TAGS}"],
                        vectors[i - start],
                        None,
                    )
                    for i in range(start, start + size)
                ],
            )
        print(f"\r  loaded {start + size:,} / {corpus.n:,} chunks", end="", flush=True)
    print()


async def _exact(
    pool: asyncpg.Pool, agent_id: int, vector: np.ndarray, k: int, tag: str | None = None
) -> list[int]:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_indexscan = off")
        rows = await conn.fetch(
            f"""SELECT id FROM chunks WHERE agent_id = $1 AND ($4::text IS NULL OR tags @> ARRAY[$4])
                 ORDER BY embedding::halfvec({DIM}) <=> $2 LIMIT $3""",
            agent_id,
            vector,
            k,
            tag,
        )
    return [r["id"] for r in rows]


async def _floor(pool: asyncpg.Pool, agent_id: int, vector: np.ndarray, k: int) -> list[int]:
    """pgvector's own query: nothing but the ordering and the limit (on the agent's index)."""
    rows = await pool.fetch(
        f"SELECT id FROM chunks WHERE agent_id = $1 "
        f"ORDER BY embedding::halfvec({DIM}) <=> $2 LIMIT $3",
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


@dataclass
class Phase:
    """The timings (ms) of one pass over the questions."""

    floor: list[float] = field(default_factory=list)
    ann: list[float] = field(default_factory=list)
    filtered: list[float] = field(default_factory=list)
    lexical: list[float] = field(default_factory=list)
    full: list[float] = field(default_factory=list)


@asynccontextmanager
async def _kept_settings(name: str) -> AsyncIterator[Settings]:
    """Settings for database ``name`` on PARLEY_DATABASE_URL's server, created when missing
    and left in place afterwards."""
    url = os.environ.get("PARLEY_DATABASE_URL")
    if not url:
        raise SystemExit("--keep needs PARLEY_DATABASE_URL (the server to keep the table on)")
    admin = await asyncpg.connect(url)
    try:
        if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    kept = urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
    yield Settings(_env_file=None, database_url=kept)  # type: ignore[call-arg]


async def main(args: argparse.Namespace) -> None:
    settings_of = _kept_settings(args.keep) if args.keep else bench_settings()
    async with settings_of as settings:
        await _run(args, settings)


async def _build(pool: asyncpg.Pool, agent_id: int, build: HnswBuild, workers: int | None) -> float:
    """Build the agent's index as `parley rebuild-index` does, printing its progress."""
    async with pool.acquire() as conn, pool.acquire() as watcher:
        if workers is not None:
            await conn.execute(f"SET max_parallel_maintenance_workers = {int(workers)}")
        settings = await conn.fetch(
            """SELECT name, setting, unit FROM pg_settings
                WHERE name IN ('maintenance_work_mem', 'max_parallel_maintenance_workers')"""
        )
        shown = ", ".join(f"{r['name']}={r['setting']}{r['unit'] or ''}" for r in settings)
        print(
            f"building the HNSW index (m={build.m}, ef_construction={build.ef_construction}, "
            f"build memory up to {build.memory_limit // 2**20} MB; server: {shown})"
        )
        pid = conn.get_server_pid()
        started = time.perf_counter()
        task = asyncio.create_task(bind_embedder(conn, agent_id, IDENTITY, build))
        last: BuildProgress | None = None
        while not task.done():
            await asyncio.wait({task}, timeout=PROGRESS_EVERY)
            if task.done():
                break
            last = await build_progress(watcher, pid) or last
            if last is not None:
                print(f"  {time.perf_counter() - started:6.0f} s  {last}", flush=True)
        await task
        return time.perf_counter() - started


async def _index_matches(pool: asyncpg.Pool, agent_id: int, build: HnswBuild) -> bool:
    definition = await pool.fetchval(
        "SELECT indexdef FROM pg_indexes WHERE indexname = $1", index_name(agent_id)
    )
    return definition is not None and (
        f"m='{build.m}'" in definition
        and f"ef_construction='{build.ef_construction}'" in definition
    )


async def _run(args: argparse.Namespace, settings: Settings) -> None:
    database = await open_database(settings, max_size=4)
    pool = database.pool
    corpus = Corpus(args.n, topics=max(50, args.n // 50))
    build = HnswBuild(
        m=args.m, ef_construction=args.ef_construction, memory_limit=args.build_memory_mb * 2**20
    )
    agents = Agents(pool)
    existing = await pool.fetchval("SELECT id FROM agents WHERE slug = 'bench'")
    count = 0
    if existing is not None:
        count = await pool.fetchval("SELECT count(*) FROM chunks WHERE agent_id = $1", existing)
    load_s: float | None = None
    if existing is None or count != args.n:
        if existing is not None:
            print(f"the kept table has {count:,} chunks, not {args.n:,}: loading anew")
            await pool.execute("DELETE FROM agents WHERE id = $1", existing)
        agent = await agents.create("bench", embedder=IDENTITY)
        print(f"loading {args.n:,} synthetic {DIM}-dim chunks")
        await pool.execute(f"DROP INDEX {index_name(agent.id)}")
        started = time.perf_counter()
        await _load(pool, agent.id, corpus)
        load_s = time.perf_counter() - started
        await pool.execute("VACUUM ANALYZE chunks")
    else:
        agent = await agents.get("bench")
        print(f"reusing the kept table of {args.n:,} chunks")

    build_s: float | None = None
    if args.rebuild or load_s is not None or not await _index_matches(pool, agent.id, build):
        build_s = await _build(pool, agent.id, build, args.workers)
        await pool.execute("VACUUM ANALYZE chunks")
    agent = await agents.get("bench")
    await database.close()

    # The pool the search runs on, its connections started as Parley's are; the floor's
    # pool starts with the candidate list the search gives this agent, so that both run
    # one round trip with the same settings.
    policy = EfSearch.fixed(args.ef_search) if args.ef_search else EF_SEARCH
    assert settings.database_url is not None
    url = settings.database_url.get_secret_value()

    async def open_pool(ef_search: int) -> asyncpg.Pool:
        created = await asyncpg.create_pool(
            url,
            min_size=2,
            max_size=4,
            init=register_vector,
            server_settings={
                "plan_cache_mode": "force_custom_plan",
                **hnsw_session(ef_search=ef_search, max_scan_tuples=args.max_scan_tuples),
            },
        )
        assert created is not None
        return created

    search_pool = await open_pool(policy.small)
    search = ChunkSearch(search_pool, policy)
    floor_pool = await open_pool(await search.ef_search(agent.id))
    try:
        await _queries(args, search, floor_pool, agent, corpus, load_s, build_s)
    finally:
        await floor_pool.close()
        await search_pool.close()


async def _queries(
    args: argparse.Namespace,
    search: ChunkSearch,
    pool: asyncpg.Pool,
    agent: Agent,
    corpus: Corpus,
    load_s: float | None,
    build_s: float | None,
) -> None:
    vectors, texts = corpus.queries(args.queries)
    ef_search = await search.ef_search(agent.id)
    retriever = Retriever(search, UseEmbedder(), LocalCache())
    filters = SearchFilters()
    tagged = SearchFilters(include_tags=("t7",))

    for vector, text in zip(vectors[:10], texts[:10], strict=True):  # warm caches
        await retriever.retrieve(
            RetrievalQuery(agent=agent, text="warm " + text, reply_language="en"), vector
        )
        await _floor(pool, agent.id, vector, args.k)

    phases = []
    for run in range(args.runs):
        phase = Phase()
        for number, (vector, text) in enumerate(zip(vectors, texts, strict=True)):
            # Taking turns at going first: neither is timed just after the other.
            for which in ("floor", "ann") if number % 2 else ("ann", "floor"):
                t = time.perf_counter()
                if which == "floor":
                    await _floor(pool, agent.id, vector, args.k)
                else:
                    await search.dense(agent.id, DIM, vector, args.k, filters)
                getattr(phase, which).append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            await search.dense(agent.id, DIM, vector, args.k, tagged)
            phase.filtered.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            await search.lexical(agent.id, DIM, vector, text, "en", 5 * args.k, filters)
            phase.lexical.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            # A question of its own per run: the retrieval cache must not answer it.
            await retriever.retrieve(
                RetrievalQuery(agent=agent, text=f"{text} r{run}", k=args.k, reply_language="en"),
                vector,
            )
            phase.full.append((time.perf_counter() - t) * 1000)
        phases.append(phase)
        print(
            f"  run {run + 1}: floor p50 {statistics.median(phase.floor):.2f} ms, "
            f"ANN p50 {statistics.median(phase.ann):.2f} ms, "
            f"full retrieve p50 {statistics.median(phase.full):.2f} / "
            f"p99 {_percentile(phase.full, 99):.2f} ms",
            flush=True,
        )

    recalls, filtered_recalls = [], []
    for vector in vectors[: args.recall_queries]:
        ann = await search.dense(agent.id, DIM, vector, args.k, filters)
        exact = await _exact(pool, agent.id, vector, args.k)
        recalls.append(len({c.chunk_id for c in ann} & set(exact)) / len(exact))
        ann = await search.dense(agent.id, DIM, vector, args.k, tagged)
        exact = await _exact(pool, agent.id, vector, args.k, "t7")
        filtered_recalls.append(len({c.chunk_id for c in ann} & set(exact)) / len(exact))

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

    def median_of(name: str, stat: str) -> float:
        """The median over the runs of one phase statistic."""
        values = [getattr(p, name) for p in phases]
        if stat == "p50":
            return statistics.median(statistics.median(v) for v in values)
        return statistics.median(_percentile(v, 99) for v in values)

    load = "reused" if load_s is None else f"{load_s:.1f} s"
    built = "reused" if build_s is None else f"{build_s:.1f} s"
    print()
    print(
        f"chunks {args.n:,}  dim {DIM} (halfvec)  HNSW m={args.m} "
        f"ef_construction={args.ef_construction} ef_search={ef_search} iterative "
        f"relaxed_order max_scan_tuples={args.max_scan_tuples}  load {load}  "
        f"index build {built}"
    )
    runs = f" (median of {args.runs} runs)" if args.runs > 1 else ""
    count = str(len(phases[0].full) * len(phases))
    rows = [("measure" + runs, "p50 ms", "p99 ms", "n")]
    for label, name in [
        (f"ANN floor: plain ORDER BY <=> LIMIT {args.k}", "floor"),
        (f"ANN top-{args.k} (ChunkSearch.dense)", "ann"),
        (f"ANN top-{args.k} filtered to one tag of {TAGS}", "filtered"),
        (f"full-text top-{5 * args.k} (ChunkSearch.lexical)", "lexical"),
        ("full retrieve (ANN+FTS+fusion+gate)", "full"),
    ]:
        rows.append(
            (label, f"{median_of(name, 'p50'):.2f}", f"{median_of(name, 'p99'):.2f}", count)
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
    ratio = median_of("ann", "p50") / median_of("floor", "p50")
    print(f"\nANN top-{args.k} against its floor: {ratio:.2f}x (p50)")
    print(
        f"recall@{args.k} against an exact scan: {statistics.mean(recalls):.3f} unfiltered, "
        f"{statistics.mean(filtered_recalls):.3f} filtered to one tag, "
        f"over {len(recalls)} queries"
    )
    _record(phases, statistics.mean(recalls), statistics.mean(filtered_recalls), load_s, build_s)


def _record(
    phases: list[Phase],
    recall: float,
    filtered_recall: float,
    load_s: float | None,
    build_s: float | None,
) -> None:
    """The figures `bench.all` keeps, one set per query phase (its medians are over them)."""
    for phase in phases:
        floor = statistics.median(phase.floor)
        record("ANN top-k floor p50 (plain ORDER BY … LIMIT)", floor, "ms")
        record("ANN top-k p50", statistics.median(phase.ann), "ms", floor=floor,
               ratio_aim=("<=", 1.5))  # fmt: skip
        record("ANN top-k filtered to one tag p50", statistics.median(phase.filtered), "ms")
        record("full-text p50", statistics.median(phase.lexical), "ms")
        record("full retrieve p50", statistics.median(phase.full), "ms", aim=("<", 20))
        record("full retrieve p99", _percentile(phase.full, 99), "ms", aim=("<", 50))
    record("recall@10 against exact search", recall, "", aim=(">=", 0.95))
    record("recall@10 filtered to one tag", filtered_recall, "")
    if load_s is not None:
        record("load", load_s, "s")
    if build_s is not None:
        record("index build", build_s, "s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000, help="synthetic chunks (default 100000)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--recall-queries", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--runs", type=int, default=1, help="query phases; medians are printed")
    parser.add_argument(
        "--keep", metavar="DATABASE", help="load into (or reuse) this database and keep it"
    )
    parser.add_argument("--rebuild", action="store_true", help="rebuild a reused index")
    parser.add_argument("--m", type=int, default=HNSW_M)
    parser.add_argument("--ef-construction", type=int, default=HNSW_EF_CONSTRUCTION)
    parser.add_argument(
        "--ef-search",
        type=int,
        help="one HNSW candidate list whatever the size (default: by the index size, as Parley)",
    )
    parser.add_argument("--max-scan-tuples", type=int, default=MAX_SCAN_TUPLES)
    parser.add_argument(
        "--build-memory-mb",
        type=int,
        default=HnswBuild().memory_limit // 2**20,
        help="maintenance_work_mem the build may raise to",
    )
    parser.add_argument(
        "--workers", type=int, help="max_parallel_maintenance_workers (default: the server's)"
    )
    asyncio.run(main(parser.parse_args()))
