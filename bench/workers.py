"""Answers per second of one `parley worker` process against two, on the same load.

    .venv/bin/python -m bench.workers                          # 600 messages, 1 then 2 workers
    .venv/bin/python -m bench.workers --messages 200 --workers 1 2 3 --answers llm

`parley serve --no-workers` takes the webhooks on the embedded defaults (a temp data dir; agent
`bench` with the sample shop ingested, so every turn embeds, searches and quotes real pages)
and the workers answer them, sending through fake Twilio and Telegram APIs in this process.
For each worker count in turn: that many `parley worker` processes start and answer a few
messages (so each has loaded what a first turn loads), then a backlog of ``--messages``
signed Twilio webhooks and Telegram updates, each from a new customer, is fired at the gateway
at ``--rate``; the answers per second are counted between the moments a tenth and nine
tenths of the backlog were answered, so neither the burst window at the start nor the last
few turns at the end weigh in. Then the workers are stopped (SIGTERM) before the next count.
With `--answers llm` the answers come from a fake model (200 ms to the first token, 50
tokens/s) and a turn mostly waits; by default (extractive, no model) it is all CPU.

Every webhook acknowledged must be answered exactly once: the run fails otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench.figures import record
from bench.rig import (
    CpuMeter,
    Processes,
    free_port,
    postgres_cpu,
    run_benchmark,
    start_postgres,
    tail,
    tree_cpu,
    wait_ready,
)
from bench.turn import start_fake_llm
from bench.webhooks import (
    AGENT,
    HOST,
    LLM_RATE,
    LLM_REPLY,
    LLM_TTFT,
    Requests,
    Target,
    _gateway_env,
    _start_fakes,
)
from core.answer.phrases import LANGUAGES, phrase
from gateway.demo import DEMO_SITE

WARM_UP = 10  # messages each worker count answers before it is measured
STARTED = "worker.started"
HOLDING = frozenset(phrase("holding", language) for language in LANGUAGES)


@dataclass
class Count:
    workers: int
    messages: int
    seconds: float  # from a tenth to nine tenths of the backlog answered
    cpu: dict[str, float]  # CPU seconds over the whole backlog, by kind of process

    @property
    def rate(self) -> float:
        return 0.8 * self.messages / self.seconds if self.seconds else float("nan")

    def cpu_ms(self, kind: str) -> float:
        return 1000 * self.cpu.get(kind, 0.0) / self.messages


def _cpu_meter(workers: list[subprocess.Popen[bytes]], data_dir: Path) -> CpuMeter:
    """CPU seconds from now: the workers (and their children) and PostgreSQL's processes."""
    return CpuMeter(
        {"workers": tree_cpu([w.pid for w in workers]), "postgres": postgres_cpu(data_dir)}
    )


async def _answered(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM inbox WHERE status = 'done'"))


async def _fire(target: Target, requests: Requests, messages: int, rate: float) -> int:
    """``messages`` webhooks, the two channels taking turns; how many were acknowledged."""
    per_channel = {"twilio": messages - messages // 2, "telegram": messages // 2}
    results = await asyncio.gather(
        *(
            target.drive(requests, channel, rate / 2, count / (rate / 2))
            for channel, count in per_channel.items()
        )
    )
    for result in results:
        if result.errors:
            raise RuntimeError(f"the gateway refused webhooks: {result.errors} errors")
    return sum(result.acked for result in results)


async def _start_workers(
    count: int, processes: Processes, argv: list[str], env: dict[str, str], tmp: Path
) -> list[subprocess.Popen[bytes]]:
    workers = []
    for number in range(count):
        log = tmp / f"worker-{count}-{number + 1}.log"
        workers.append(processes.start(argv, env, tmp, log))
    deadline = time.monotonic() + 120
    for number, worker in enumerate(workers):
        log = tmp / f"worker-{count}-{number + 1}.log"
        while STARTED not in log.read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"parley worker did not start:\n{tail(log)}")
            await asyncio.sleep(0.2)
    return workers


def _stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)


async def _until_answered(pool: asyncpg.Pool, start: int, total: int, within: float) -> list[float]:
    """Loop times at which the answered count reached each tenth of ``total`` more than
    ``start`` (the count before the backlog); raises when it does not get there in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    reached: list[float] = []
    while len(reached) < 10:
        if loop.time() > deadline:
            done = await _answered(pool) - start
            rows = await pool.fetch(
                "SELECT status, count(*) AS n, max(left(error, 200)) AS error FROM inbox "
                "GROUP BY status"
            )
            states = "; ".join(f"{r['status']} {r['n']} ({r['error']})" for r in rows)
            raise RuntimeError(
                f"only {done} of {total} answered within {within:g} s; inbox: {states}"
            )
        done = await _answered(pool) - start
        while len(reached) < 10 and done >= total * (len(reached) + 1) / 10:
            reached.append(loop.time())
        await asyncio.sleep(0.05)
    return reached


async def measure(
    count: int,
    args: argparse.Namespace,
    setup: dict[str, Any],
) -> Count:
    processes: Processes = setup["processes"]
    pool: asyncpg.Pool = setup["pool"]
    target: Target = setup["target"]
    requests: Requests = setup["requests"]
    # At INFO, so that the log says when each has started.
    env = setup["env"] | {"PARLEY_LOG_LEVEL": "INFO"}
    workers = await _start_workers(count, processes, setup["worker"], env, setup["tmp"])
    try:
        before = await _answered(pool)
        await _fire(target, requests, WARM_UP * count, 50)
        await _until_answered_count(pool, before + WARM_UP * count, 120)
        meter = _cpu_meter(workers, setup["data_dir"])
        start = await _answered(pool)  # the workers answer as the backlog comes in
        acked = await _fire(target, requests, args.messages, args.rate)
        reached = await _until_answered(pool, start, acked, args.within)
        cpu = meter.used()
    finally:
        await asyncio.to_thread(_stop, workers)
    for worker in workers:
        if worker.returncode not in (0, -signal.SIGTERM):
            raise RuntimeError(f"a worker exited with {worker.returncode}")
    return Count(count, acked, reached[8] - reached[0], cpu)


async def _until_answered_count(pool: asyncpg.Pool, total: int, within: float) -> None:
    deadline = time.monotonic() + within
    while await _answered(pool) < total:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm-up was not answered within {within:g} s")
        await asyncio.sleep(0.1)


def _replies(twilio: Any, telegram: Any) -> Counter[str]:
    """Answers received per customer; holding messages ("we'll reply shortly") are not."""
    sent = [(str(m["to"]), m["body"]) for m in twilio.messages]
    sent += [(str(m["chat_id"]), m["text"]) for m in telegram.messages]
    return Counter(customer for customer, text in sent if text.strip() not in HOLDING)


async def _check_once(pool: asyncpg.Pool, twilio: Any, telegram: Any) -> bool:
    """Every inbox row answered, and each customer given exactly one answer."""
    open_rows = await pool.fetchval("SELECT count(*) FROM inbox WHERE status <> 'done'")
    rows = await pool.fetchval("SELECT count(*) FROM inbox")
    replies = _replies(twilio, telegram)
    deadline = time.monotonic() + 30  # the outbox may still be sending the last replies
    while sum(replies.values()) < rows and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        replies = _replies(twilio, telegram)
    doubled = sum(1 for n in replies.values() if n > 1)
    print(
        f"\nanswered once: {len(replies)} customers of {rows} messages; "
        f"doubled {doubled}; not answered {open_rows}"
    )
    return open_rows == 0 and doubled == 0 and len(replies) == rows


def _report(counts: list[Count]) -> None:
    print("\nworkers  answers/s  vs 1 worker  worker CPU ms/answer  PostgreSQL CPU ms/answer")
    first = counts[0]
    for count in counts:
        record(f"answers/s with {count.workers} worker(s)", count.rate, "/s", floor=first.rate)
        print(
            f"{count.workers:>7}  {count.rate:>9.1f}  {count.rate / first.rate:>10.2f}x  "
            f"{count.cpu_ms('workers'):>20.1f}  {count.cpu_ms('postgres'):>24.1f}"
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"\n(answers/s from a tenth to nine tenths of each backlog; the workers, PostgreSQL, "
        f"the gateway and this process share {cores} cores)"
    )


async def run(args: argparse.Namespace, tmp: Path, processes: Processes, release: list[Any]) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    answering = "a fake model" if args.answers == "llm" else "extractively, no model"
    print(
        f"machine: {cores} cores, {platform.machine()}, Python {platform.python_version()}; "
        f"{args.messages} messages per worker count, answered {answering}",
        flush=True,
    )
    data_dir = tmp / "data"
    database_url = await start_postgres(data_dir, release)
    runners, twilio, telegram, twilio_api, telegram_api = await _start_fakes()
    release.extend(runners)
    llm = None
    if args.answers == "llm":
        llm_runner, llm = await start_fake_llm(LLM_TTFT, LLM_RATE, LLM_REPLY)
        release.append(llm_runner)
    port = free_port()
    env = _gateway_env(data_dir, port, twilio_api, telegram_api, llm)
    parley = str(Path(sys.executable).with_name("parley"))
    for command in (["agent", "create", AGENT], ["ingest", "--agent", AGENT, str(DEMO_SITE)]):
        done = subprocess.run([parley, *command], env=env, cwd=tmp, capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(f"parley {command[0]} failed:\n{done.stderr.decode()}")
    gateway_log = tmp / "gateway.log"
    gateway = processes.start([parley, "serve", "--no-workers"], env, tmp, gateway_log)
    base = f"http://{HOST}:{port}"
    await wait_ready(base, gateway, "parley serve", gateway_log)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    release.append(pool)
    target = Target("gateway", base, 64, 10.0, [gateway.pid])
    release.append(target)
    setup = {
        "processes": processes,
        "pool": pool,
        "target": target,
        "requests": Requests(public_url=base),
        "data_dir": data_dir,
        "worker": [parley, "worker"],
        "env": env,
        "tmp": tmp,
    }
    counts = []
    for count in args.workers:
        print(f"{count} worker(s): warming up, then {args.messages} messages", flush=True)
        counts.append(await measure(count, args, setup))
        print(f"  {counts[-1].rate:.1f} answers/s", flush=True)
    _report(counts)
    ok = await _check_once(pool, twilio, telegram)
    if gateway.poll() is not None:
        print(f"parley serve exited early:\n{tail(gateway_log)}")
        ok = False
    return 0 if ok else 1


def main(args: argparse.Namespace) -> int:
    return run_benchmark("workers", run, args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2],
        help="worker process counts to measure, in order (default: 1 2)",
    )
    parser.add_argument(
        "--messages", type=int, default=600, help="backlog per worker count (default: 600)"
    )
    parser.add_argument(
        "--rate", type=float, default=400.0, help="webhooks/s the backlog is fired at (400)"
    )
    parser.add_argument(
        "--answers",
        choices=["llm", "extractive"],
        default="extractive",
        help="how the workers answer: extractively (default) or with a fake model",
    )
    parser.add_argument(
        "--within",
        type=float,
        default=600.0,
        help="seconds a backlog may take to be answered (default: 600)",
    )
    return parser


if __name__ == "__main__":
    parsed = _parser().parse_args()
    if not parsed.workers or not all(1 <= n <= 8 for n in parsed.workers):
        _parser().error("--workers: counts of 1-8")
    if parsed.messages < 20 or parsed.rate <= 0:
        _parser().error("--messages must be at least 20 and --rate > 0")
    sys.exit(main(parsed))
