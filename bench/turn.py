"""Widget turns under load: time to the first SSE event and the gateway-added time to first token.

    .venv/bin/python -m bench.turn                   # 1, 10 and 50 streams, 100k chunks
    .venv/bin/python -m bench.turn --ttft 0.3 --rate 40 --rounds 5 --chunks 0
    .venv/bin/python -m bench.turn --data-dir /tmp/turn-data   # load once, reuse after
    .venv/bin/python -m bench.turn --streams 50 --profile /tmp/turn.txt   # py-spy raw

A fake OpenAI-compatible LLM (fixed time to first token, fixed token rate) runs in this
process; `parley serve --demo` runs as a separate process on the embedded defaults with the
LLM pointed at the fake. The baseline is the same client streaming straight from the fake LLM,
in the same run: "added" is the gateway's first token minus the baseline's, per percentile.

The demo agent's knowledge is the sample shop plus ``--chunks`` synthetic chunks made as
bench/retrieval.py makes them (vectors around topic centres, texts of made-up words), so
every search runs over that many rows while the questions, the shop's evaluation questions,
are still answered from its real pages. Each turn asks a question no earlier turn asked (a
repeated one would be answered from the retrieval and answer caches); the first-token
figures count the turns the model answered.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx
import psutil
from aiohttp import web
from httpx_sse import aconnect_sse

from bench.figures import record
from bench.retrieval import Corpus
from bench.rig import CpuMeter, cpu_seconds, free_port, own_cpu, postgres_cpu
from core.settings import Settings
from core.store import Agents, open_database
from core.store.vector_index import EmbedderIdentity, bind_embedder, index_name
from gateway.commands.serve import DEMO_AGENT, prepare_demo
from tests.fakes.openai import FakeOpenAI

# The shop's evaluation questions; follow-ups need a conversation, and every turn here is a
# new visitor's first.
QUESTIONS = [
    q["question"]
    for q in map(
        json.loads, (Path(__file__).parent / "data" / "questions.jsonl").read_text().splitlines()
    )
    if q["kind"] != "followup"
]
random.Random(11).shuffle(QUESTIONS)
SYNTHETIC = "/synthetic/"  # where the synthetic chunks' pages live
IDENTITY = EmbedderIdentity("use:universal-sentence-encoder-multilingual-3", 512)
# The aims, at AIM_STREAMS concurrent streams (ms): the first event's p50, and the time to the
# first token the gateway adds to the model's own (p50 and p99).
AIM_STREAMS = 50
AIM_FIRST_EVENT_P50 = 10.0
AIM_ADDED_P50 = 30.0
AIM_ADDED_P99 = 100.0
REPLY = " ".join(["Parcels to Belgium arrive within one to two working days [1]."] * 4)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _gateway_turn(
    client: httpx.AsyncClient, key: str, session: str, question: str
) -> tuple[float, float, str]:
    """(ms to the first event, ms to the first token, how it was answered) of one turn."""
    started = time.perf_counter()
    first_event = first_token = None
    mode = ""
    body = {"message": question, "session_id": session}
    async with aconnect_sse(
        client, "POST", "/api/v1/agents/demo/chat", json=body, headers={"X-Parley-Key": key}
    ) as source:
        source.response.raise_for_status()
        async for event in source.aiter_sse():
            now = (time.perf_counter() - started) * 1000
            first_event = first_event if first_event is not None else now
            if event.event == "token" and first_token is None:
                first_token = now
            if event.event in ("done", "error"):
                if event.event == "error":
                    raise RuntimeError(f"turn failed: {event.data}")
                mode = str(json.loads(event.data).get("mode"))
                break
    assert first_event is not None
    assert first_token is not None
    return first_event, first_token, mode


async def _baseline_turn(client: httpx.AsyncClient) -> float:
    """ms to the first token streaming straight from the fake LLM."""
    started = time.perf_counter()
    body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"content"' in line and '"content": ""' not in line:
                return (time.perf_counter() - started) * 1000
    raise RuntimeError("no token from the fake LLM")


async def _level(
    base: str, llm: str, key: str, streams: int, rounds: int, questions: itertools.cycle[str]
) -> dict[str, list[float]]:
    limits = httpx.Limits(max_connections=streams + 5, max_keepalive_connections=streams + 5)
    results: dict[str, list[float]] = {
        "event": [],
        "token": [],
        "baseline": [],
        "other": [],
        "lag": [],
    }
    async with (
        httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as gateway,
        httpx.AsyncClient(base_url=llm, timeout=60, limits=limits) as direct,
    ):

        async def visitor(number: int) -> None:
            for turn in range(rounds):
                # A new visitor each turn: a follow-up would add the rewrite model's own latency.
                session = f"bench-{streams}-{number:03d}-{turn:03d}"
                event, token, mode = await _gateway_turn(gateway, key, session, next(questions))
                results["event"].append(event)
                # Answered without the model (small talk, a deferral...): no first token to
                # compare with the model's.
                results["token" if mode == "llm" else "other"].append(token)
                results["baseline"].append(await _baseline_turn(direct))

        lag = asyncio.create_task(_loop_lag(results["lag"]))
        await asyncio.gather(*(visitor(n) for n in range(streams)))
        lag.cancel()
    return results


async def _loop_lag(lags: list[float], every: float = 0.01) -> None:
    """How late this process's own event loop wakes up (ms): what every figure measured here
    carries besides the gateway's time, the load generator's share of a busy machine."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + every
        await asyncio.sleep(every)
        lags.append((loop.time() - due) * 1000)


async def start_fake_llm(ttft: float, rate: float, reply: str = REPLY) -> tuple[web.AppRunner, str]:
    """A fake OpenAI-compatible LLM on a free port: (its runner, its base URL without /v1)."""
    fake = FakeOpenAI(first_token_delay=ttft, token_delay=1.0 / rate, default_reply=reply)
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def prepare_knowledge(data_dir: Path, chunks: int) -> None:
    """The demo agent with the sample shop and ``chunks`` synthetic chunks, in the embedded
    PostgreSQL at ``data_dir``; a directory prepared before with as many is used as it is."""
    settings = Settings(_env_file=None, data_dir=data_dir)  # type: ignore[call-arg]
    started = time.perf_counter()
    await prepare_demo(settings)
    print(f"sample shop ingested in {time.perf_counter() - started:.1f} s")
    database = await open_database(settings, max_size=2)
    try:
        pool = database.pool
        agent = await Agents(pool).get(DEMO_AGENT)
        have = await pool.fetchval(
            "SELECT count(*) FROM chunks c JOIN pages p ON p.id = c.page_id "
            "WHERE c.agent_id = $1 AND p.url LIKE $2",
            agent.id,
            f"{SYNTHETIC}%",
        )
        indexed = await pool.fetchval("SELECT to_regclass($1) IS NOT NULL", index_name(agent.id))
        if have == chunks and indexed:
            print(f"{chunks:,} synthetic chunks already loaded")
            return
        await pool.execute(
            "DELETE FROM sources WHERE agent_id = $1 AND location = $2", agent.id, SYNTHETIC
        )
        if chunks == 0:
            return
        # One index build after the rows are in is far faster than growing it row by row.
        await pool.execute(f"DROP INDEX IF EXISTS {index_name(agent.id)}")
        started = time.perf_counter()
        await _load(pool, agent.id, Corpus(chunks, topics=max(50, chunks // 50)))
        load_s = time.perf_counter() - started
        async with pool.acquire() as conn:
            await conn.execute("SET maintenance_work_mem = '2GB'")
            await conn.execute("SET max_parallel_maintenance_workers = 1")
            started = time.perf_counter()
            await bind_embedder(conn, agent.id, IDENTITY)
            build_s = time.perf_counter() - started
            await conn.execute("VACUUM ANALYZE chunks")
            await conn.execute("VACUUM ANALYZE pages")
        print(f"{chunks:,} synthetic chunks: COPY {load_s:.1f} s, HNSW index build {build_s:.1f} s")
    finally:
        await database.close()


async def _load(pool: asyncpg.Pool, agent_id: int, corpus: Corpus) -> None:
    """The corpus's chunks, ten to a page, by COPY (pages by one INSERT per batch)."""
    source = await pool.fetchval(
        "INSERT INTO sources (agent_id, kind, location) VALUES ($1, 'text', $2) RETURNING id",
        agent_id,
        SYNTHETIC,
    )
    batch = 10_000
    for start in range(0, corpus.n, batch):
        size = min(batch, corpus.n - start)
        vectors, texts = corpus.batch(start, size)
        async with pool.acquire() as conn, conn.transaction():
            page_ids = await conn.fetch(
                """INSERT INTO pages (agent_id, source_id, url, title, locale, content_hash)
                   SELECT $1, $2, $5 || g, 'Page ' || g, 'en', '\\x00'
                     FROM generate_series($3::int, $4::int) g ORDER BY g RETURNING id""",
                agent_id,
                source,
                start // 10,
                (start + size - 1) // 10,
                SYNTHETIC,
            )
            pages = [r["id"] for r in page_ids]
            await conn.copy_records_to_table(
                "chunks",
                columns=["agent_id", "page_id", "ord", "heading", "text", "locale", "embedding"],
                records=[
                    (agent_id, pages[i // 10 - start // 10], i % 10, "Page", texts[i - start],
                     "en", vectors[i - start])
                    for i in range(start, start + size)
                ],
            )  # fmt: skip
        print(f"\r  loaded {start + size:,} / {corpus.n:,} chunks", end="", flush=True)
    print()


def _cpu_meter(gateway: int, data_dir: Path) -> CpuMeter:
    """CPU seconds from now: the gateway's event-loop thread, the whole gateway process, the
    PostgreSQL serving ``data_dir`` and this process. Unlike latencies, these hardly depend on
    what else the machine runs."""
    process = psutil.Process(gateway)
    return CpuMeter(
        {
            "loop": lambda: _main_thread_cpu(process),
            "gateway": lambda: cpu_seconds(process),
            "postgres": postgres_cpu(data_dir),
            "bench": own_cpu,  # the visitors, the baseline and the fake LLM
        }
    )


def _main_thread_cpu(process: psutil.Process) -> float:
    """CPU seconds of a process's main thread, where its event loop runs."""
    main = (t for t in process.threads() if t.id == process.pid)
    return float(sum(t.user_time + t.system_time for t in main))


def _start_profile(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling the gateway (every thread, idle ones left out) until interrupted."""
    spy = str(Path(sys.executable).with_name("py-spy"))
    fmt = "speedscope" if out.suffix == ".json" else "raw"
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--output", str(out), "--format", fmt,
         "--rate", "200", "--threads", "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="parley-bench-turn-") as tmp:
        data_dir = args.data_dir or Path(tmp) / "data"
        await prepare_knowledge(data_dir, args.chunks)
        await _run(args, Path(tmp), data_dir)


async def _run(args: argparse.Namespace, tmp: Path, data_dir: Path) -> None:
    runner, llm = await start_fake_llm(args.ttft, args.rate)
    port = free_port()
    parley = str(Path(sys.executable).with_name("parley"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARLEY_", "OPENAI_"))}
    env |= {
        "PARLEY_DATA_DIR": str(data_dir),
        "PARLEY_PORT": str(port),
        "PARLEY_LLM_BASE_URL": f"{llm}/v1",
        "PARLEY_LLM_API_KEY": "sk-bench",
        "PARLEY_LLM_MODEL": "bench",
        "PARLEY_LOG_LEVEL": "WARNING",
    }
    gateway = subprocess.Popen([parley, "serve", "--demo"], env=env, cwd=tmp)
    questions = itertools.cycle(QUESTIONS)
    try:
        base = f"http://127.0.0.1:{port}"
        key = await _wait_for_demo(base, gateway)
        # Generous widget limits: this one address opens many streams on purpose.
        updated = subprocess.run(
            [parley, "agent", "update", "demo", "--rate-limit-ip", "1000/1000",
             "--rate-limit-session", "1000/1000"],
            env=env, capture_output=True, text=True,
        )  # fmt: skip
        if updated.returncode and "nothing to change" not in updated.stderr:  # a reused --data-dir
            raise RuntimeError(f"parley agent update failed: {updated.stderr}")
        async with httpx.AsyncClient(base_url=base, timeout=60) as warm:
            for number in range(3):
                await _gateway_turn(warm, key, f"warm-up-{number:03d}", next(questions))
        print(
            f"fake LLM: time to first token {args.ttft * 1000:.0f} ms, {args.rate:.0f} tokens/s; "
            f"{args.rounds} turns per stream; {args.chunks:,} synthetic chunks besides the shop\n"
        )
        rows = [
            (
                "streams",
                "turns",
                "by model",
                "first event p50",
                "p99",
                "first token p50",
                "p99",
                "baseline p50",
                "p99",
                "added p50",
                "added p99",
                "turns/s",
                "CPU/turn loop",
                "gateway",
                "postgres",
                "bench",
                "bench lag p50",
                "p99",
            )
        ]
        profiled = max(args.streams)
        for streams in args.streams:
            spy = (
                _start_profile(gateway.pid, args.profile)
                if args.profile and streams == profiled
                else None
            )
            meter = _cpu_meter(gateway.pid, data_dir)
            started = time.perf_counter()
            try:
                r = await _level(base, llm, key, streams, args.rounds, questions)
                rate = streams * args.rounds / (time.perf_counter() - started)
                cpu = {name: used * 1000 / (streams * args.rounds)
                       for name, used in meter.used().items()}  # fmt: skip
            finally:
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    _, err = spy.communicate(timeout=120)
                    if spy.returncode:
                        print(f"py-spy failed: {err.decode(errors='replace')}", file=sys.stderr)
            e, t, b = r["event"], r["token"], r["baseline"]
            rows.append((
                str(streams), str(len(e)), str(len(t)),
                f"{statistics.median(e):.1f}", f"{_pct(e, 99):.1f}",
                f"{statistics.median(t):.1f}", f"{_pct(t, 99):.1f}",
                f"{statistics.median(b):.1f}", f"{_pct(b, 99):.1f}",
                f"{statistics.median(t) - statistics.median(b):.1f}",
                f"{_pct(t, 99) - _pct(b, 99):.1f}",
                f"{rate:.1f}", f"{cpu['loop']:.1f}", f"{cpu['gateway']:.1f}",
                f"{cpu['postgres']:.1f}", f"{cpu['bench']:.1f}",
                f"{statistics.median(r['lag']):.1f}", f"{_pct(r['lag'], 99):.1f}",
            ))  # fmt: skip
            _record(streams, r, cpu, rate)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for number, row in enumerate(rows):
            print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
            if number == 0:
                print("  ".join("-" * w for w in widths))
        print(
            "\n(milliseconds; 'by model': turns the model answered, which the first-token "
            "figures count;\n'added' = gateway first token minus the direct baseline; CPU per "
            "turn: the gateway's event-loop thread,\nthe whole gateway process (background work "
            "included), PostgreSQL, this load generator with the fake LLM; bench lag: how late "
            "this\nprocess's own event loop woke up, which every figure here carries besides the "
            "gateway's time)"
        )
        if args.profile:
            print(f"profile of the {profiled}-stream level: {args.profile}")
    finally:
        gateway.terminate()
        gateway.wait(30)
        await runner.cleanup()


def _record(
    streams: int, results: dict[str, list[float]], cpu: dict[str, float], rate: float
) -> None:
    """The level's figures for `bench.all` (aims at AIM_STREAMS streams)."""
    aimed = streams == AIM_STREAMS
    event, token, baseline = results["event"], results["token"], results["baseline"]
    record(
        f"first SSE event p50 ({streams} streams)",
        statistics.median(event),
        "ms",
        aim=("<", AIM_FIRST_EVENT_P50) if aimed else None,
    )
    record(f"first SSE event p99 ({streams} streams)", _pct(event, 99), "ms")
    record(
        f"first token p50 ({streams} streams)",
        statistics.median(token),
        "ms",
        floor=statistics.median(baseline),
    )
    record(f"first token p99 ({streams} streams)", _pct(token, 99), "ms", floor=_pct(baseline, 99))
    record(
        f"gateway-added time to first token p50 ({streams} streams)",
        statistics.median(token) - statistics.median(baseline),
        "ms",
        aim=("<", AIM_ADDED_P50) if aimed else None,
    )
    record(
        f"gateway-added time to first token p99 ({streams} streams)",
        _pct(token, 99) - _pct(baseline, 99),
        "ms",
        aim=("<", AIM_ADDED_P99) if aimed else None,
    )
    for part, used in cpu.items():
        record(f"CPU per turn, {part} ({streams} streams)", used, "ms")
    record(f"turns per second ({streams} streams)", rate, "turns/s")
    record(
        f"load generator's loop lag p50 ({streams} streams)",
        statistics.median(results["lag"]),
        "ms",
    )
    record(f"load generator's loop lag p99 ({streams} streams)", _pct(results["lag"], 99), "ms")


async def _wait_for_demo(base: str, gateway: subprocess.Popen[bytes]) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        for _ in range(600):
            if gateway.poll() is not None:
                raise RuntimeError("parley serve --demo exited")
            try:
                page = await client.get("/en/index.html")
                if page.status_code == 200:
                    match = re.search(r'data-key="([^"]+)"', page.text)
                    if match:
                        return match.group(1)
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the demo did not come up within two minutes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ttft", type=float, default=0.2, help="fake LLM time to first token, s")
    parser.add_argument("--rate", type=float, default=50.0, help="fake LLM tokens per second")
    parser.add_argument("--rounds", type=int, default=4, help="turns per stream")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument(
        "--chunks", type=int, default=100_000, help="synthetic chunks besides the shop (100000)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="keep the embedded PostgreSQL here (the knowledge is loaded once, then reused)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="record the gateway with py-spy during the largest level (.json: speedscope, "
        "else raw collapsed stacks)",
    )
    asyncio.run(main(parser.parse_args()))
