"""Extractive answers per second: turns answered without a model, the vectors of the quoted
pieces read from the index (stored at ingest) against encoding every piece on every turn.

    .venv/bin/python -m bench.extractive                        # 8 at once, 2 x 8 s per setting
    .venv/bin/python -m bench.extractive --concurrency 16 --seconds 5 --rounds 3
    .venv/bin/python -m bench.extractive --settings stored      # one setting (for a profiler)

Ingests `bench/data/shop/` (embedded PostgreSQL in a temp dir, or PARLEY_DATABASE_URL) and
asks the questions of `bench/data/answers.jsonl` (without their earlier turns, each in a new
conversation, with the page the visitor is on) through the production `AnswerPipeline` with
no model: retrieval, the quote, the confidence estimate and saving the turn, as a WhatsApp or
widget turn does. `--concurrency` turns run at once, each asking the next question as soon as
its last one is answered (closed loop), for `--seconds`.

Two settings in the same process, on the same database and the same warm retrieval cache
(every question is asked once before anything is measured), measured in alternating rounds:
`stored` (the default: the pieces' vectors come from the index, a turn encodes its
question) and `computed` (PipelineConfig(stored_pieces=False): every piece of every source
is encoded on every turn, as before the vectors were stored). The semantic answer cache is
off, so that every turn quotes.

Printed per setting: answers/s, the time per answer (p50, p99), the time of the quote alone
(p50, p99, from the turn traces), the texts encoded per answer, and the ratio of answers/s.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np
import psutil
from numpy.typing import NDArray

from bench.database import bench_settings
from bench.eval_answers import AGENT, DATA, Case, ask, load_cases, open_shop
from bench.figures import record
from core.answer.factory import build_pipeline
from core.answer.pipeline import AnswerPipeline, PipelineConfig
from core.cache import LocalCache
from core.retrieval.embedders import UseEmbedder
from core.store import Database

SETTINGS = ("stored", "computed")


class CountingEmbedder:
    """The bundled encoder, counting the texts it encodes."""

    def __init__(self, inner: UseEmbedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.texts = 0

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        self.texts += len(texts)
        return await self.inner.embed(texts)


@dataclass
class Tally:
    seconds: float = 0.0
    waits: list[float] = field(default_factory=list)  # ms per answer
    quotes: list[float] = field(default_factory=list)  # ms of the quote, from the traces
    encoded: int = 0  # texts encoded
    failed: int = 0
    cpu: float = 0.0  # seconds of CPU in this process (the pipeline, the encoder's thread)
    cpu_postgres: float = 0.0  # ... and in the PostgreSQL backends serving it

    @property
    def rate(self) -> float:
        return len(self.waits) / self.seconds if self.seconds else 0.0


def _pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else 0


async def _round(
    pipeline: AnswerPipeline,
    embedder: CountingEmbedder,
    database: Database,
    cases: Sequence[Case],
    tally: Tally,
    *,
    label: str,
    concurrency: int,
    seconds: float,
) -> None:
    """``concurrency`` customers asking question after question for ``seconds``."""
    questions = itertools.cycle(cases)
    keys = itertools.count()
    encoded = embedder.texts
    turn_ids: list[int] = []
    backends = _cpu(await _backends(database))
    cpu = time.process_time()
    started = time.perf_counter()
    deadline = started + seconds

    async def customer() -> None:
        while time.perf_counter() < deadline:
            case = next(questions)
            began = time.perf_counter()
            output, outcome = await ask(pipeline, f"{label}-{next(keys)}", case.question, case.page)
            if output.error or outcome.mode != "extractive":
                tally.failed += 1
                continue
            tally.waits.append((time.perf_counter() - began) * 1000)
            if outcome.turn_id is not None:
                turn_ids.append(outcome.turn_id)

    await asyncio.gather(*(customer() for _ in range(concurrency)))
    tally.seconds += time.perf_counter() - started
    tally.cpu += time.process_time() - cpu
    # (a backend opened during the round counts from nothing)
    now = _cpu(await _backends(database))
    tally.cpu_postgres += sum(used - backends.get(pid, 0.0) for pid, used in now.items())
    tally.encoded += embedder.texts - encoded
    rows = await database.pool.fetch(
        "SELECT (trace->'timings_ms'->>'quote')::float AS quote FROM turns WHERE id = ANY($1)",
        turn_ids,
    )
    tally.quotes += [r["quote"] for r in rows if r["quote"] is not None]


async def _backends(database: Database) -> dict[int, psutil.Process]:
    """The PostgreSQL processes serving this database (none when the server is elsewhere)."""
    pids = await database.pool.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
    )
    found = {}
    for row in pids:
        try:
            found[row["pid"]] = psutil.Process(row["pid"])
        except psutil.Error:
            continue
    return found


def _cpu(processes: dict[int, psutil.Process]) -> dict[int, float]:
    """CPU seconds used so far by each process."""
    used = {}
    for pid, process in processes.items():
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        used[pid] = times.user + times.system
    return used


async def run(args: argparse.Namespace) -> dict[str, Tally]:
    cases = [c for c in load_cases(Path(args.questions)) if not c.history]
    async with bench_settings() as settings:
        database, embedder, agents = await open_shop(settings)
        await agents.update(AGENT, settings={"answer_cache": False})
        counting = CountingEmbedder(embedder)
        cache = LocalCache()
        tallies = {name: Tally() for name in args.settings}
        async with aiohttp.ClientSession() as session:
            pipelines = {
                name: build_pipeline(
                    settings,
                    database.pool,
                    cache,
                    counting,
                    session,
                    chat=None,
                    config=PipelineConfig(pace_seconds=0.0, stored_pieces=name == "stored"),
                )
                for name in args.settings
            }
            # Every question once: the retrieval cache is warm, and pieces only a turn puts
            # together (rows joined across two chunks) are stored, for both settings alike.
            warming = build_pipeline(
                settings,
                database.pool,
                cache,
                embedder,
                session,
                chat=None,
                config=PipelineConfig(pace_seconds=0.0),
            )
            for case in cases:
                await ask(warming, f"warm-{case.qid}", case.question, case.page)
            await warming.memory.drain()
            print(f"asked {len(cases)} questions once; measuring", flush=True)
            for number in range(args.rounds):
                for name in args.settings:
                    await _round(
                        pipelines[name],
                        counting,
                        database,
                        cases,
                        tallies[name],
                        label=f"{name}-{number}",
                        concurrency=args.concurrency,
                        seconds=args.seconds,
                    )
            for pipeline in pipelines.values():
                await pipeline.memory.drain()
        await database.close()
    return tallies


def report(tallies: dict[str, Tally], concurrency: int) -> None:
    print(f"\n{concurrency} turns at once, no model, {len(tallies)} setting(s):\n")
    print(
        f"{'setting':<10}{'answers':>8}{'answers/s':>11}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'quote p50':>11}{'quote p99':>11}{'encoded':>9}{'cpu ms':>8}{'pg ms':>7}"
        f"{'failed':>8}"
    )
    for name, t in tallies.items():
        n = max(len(t.waits), 1)
        print(
            f"{name:<10}{len(t.waits):>8}{t.rate:>11.1f}{_pct(t.waits, 50):>9.1f}"
            f"{_pct(t.waits, 99):>9.1f}{_pct(t.quotes, 50):>11.1f}{_pct(t.quotes, 99):>11.1f}"
            f"{t.encoded / n:>9.1f}{1000 * t.cpu / n:>8.1f}{1000 * t.cpu_postgres / n:>7.1f}"
            f"{t.failed:>8}"
        )
    print(
        "\n(encoded: texts encoded per answer; cpu ms: CPU per answer in this process, the "
        "encoder's thread included; pg ms: in the PostgreSQL backends serving it)"
    )
    if {"stored", "computed"} <= tallies.keys() and tallies["computed"].rate:
        ratio = tallies["stored"].rate / tallies["computed"].rate
        quote = statistics.median(tallies["computed"].quotes or [0]) / max(
            statistics.median(tallies["stored"].quotes or [1]), 1e-9
        )
        print(f"\nstored / computed: {ratio:.1f}x answers/s, quote p50 {quote:.1f}x faster")
    if "stored" in tallies:
        stored = tallies["stored"]
        baseline = tallies["computed"].rate if "computed" in tallies else None
        record("answers/s, no model", stored.rate, "/s", floor=baseline, aim=(">=", 100))
        record("time per answer p50", _pct(stored.waits, 50), "ms")
        record("time per answer p99", _pct(stored.waits, 99), "ms")
        record("CPU per answer (Parley)", 1000 * stored.cpu / max(len(stored.waits), 1), "ms")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0, help="per setting and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--questions", default=str(DATA / "answers.jsonl"))
    return parser


def main() -> None:
    args = _parser().parse_args()
    report(asyncio.run(run(args)), args.concurrency)


if __name__ == "__main__":
    main()
