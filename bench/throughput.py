"""WhatsApp answers with a slow model: how long customers wait for their answer, and none lost.

    .venv/bin/python -m bench.throughput                       # 30 webhooks/s for 20 s, 1 s model
    .venv/bin/python -m bench.throughput --content none        # the least work a turn does
    .venv/bin/python -m bench.throughput --rate 10 --seconds 5 --settings new
    .venv/bin/python -m bench.throughput --burst-window 0.5 --layout split

`parley serve` runs in its own process on the embedded defaults (a temp data dir; agent
`bench` with the sample shop of `bench/data/shop` ingested, so every turn embeds, searches and
quotes real pages; or, with `--content none`, no pages at all), its model pointed at a fake OpenAI-compatible server in this process that
answers every request after `--model-seconds` (1 s). Signed Twilio webhooks, each from a new
customer, are fired at `--rate` per second for `--seconds` whatever the answers do (open
loop). A customer's wait runs from the moment their webhook was due to the moment their
answer reached the fake Twilio Messages API in this process (one clock); holding messages
("we'll reply as soon as we can") are counted apart and end no wait.

Two settings in the same run, each in a fresh `parley serve` on the same database: `new` (the
defaults: 256 turns in flight per process, 4 work slots, a turn waiting on the model holds no
slot) and `old` (PARLEY_WORKER_CONCURRENCY=8 and PARLEY_WORKER_CPU_SLOTS=8: 8 turns in flight,
as many as work slots, so 8 turns waiting on the model fill the process, as before turns gave
their slot back; the rest of the code is the same in both).

After the load each setting gets `--drain` seconds (at most) to answer what is left. Then:
answered (an answer arrived), lost (acknowledged, no answer by the end), doubled (more than
one answer for one message), the wait's median, p99 and maximum, and the CPU time each
answer cost in Parley's processes, in PostgreSQL and in this process (the load and the fakes),
all on the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web
from twilio.request_validator import RequestValidator

from bench.figures import record
from bench.rig import (
    CpuMeter,
    Processes,
    free_port,
    own_cpu,
    postgres_cpu,
    run_benchmark,
    start_postgres,
    tail,
    tree_cpu,
    wait_ready,
)
from bench.webhooks import HOST, TWILIO_FROM, TWILIO_SID, TWILIO_TOKEN, _gateway_env
from core.settings import Settings
from gateway.demo import DEMO_SITE
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio

AGENT = "bench"
# What the fake model answers; MARK tells an answer from a holding message at the fake Twilio.
REPLY = "Parcels leave our warehouse within one working day and arrive in 1-3 days [1]."
MARK = "warehouse"
QUESTIONS = [
    "How long does delivery to Belgium take?",
    "Hoe lang duurt de levering naar Duitsland?",
    "Welche Zahlungsmethoden gibt es?",
    "Can I return shoes I have worn outside?",
    "Is the Stormvang jacket waterproof?",
    "Wat kost verzending naar België?",
]
DEFAULT_WINDOW = float(Settings.model_fields["burst_window_seconds"].default)
WARM_UP = 8  # customers answered before each setting is measured (loads what a turn loads)
SETTINGS = {
    "new": {},
    "old": {"PARLEY_WORKER_CONCURRENCY": "8", "PARLEY_WORKER_CPU_SLOTS": "8"},
}


# --- the fakes --------------------------------------------------------------------------------


@dataclass
class Fakes:
    model: FakeOpenAI
    twilio: FakeTwilio
    model_url: str
    twilio_url: str
    telegram_url: str
    runners: list[web.AppRunner]
    arrived: dict[str, float] = field(default_factory=dict)  # message sid -> loop time

    def answers(self) -> dict[str, list[float]]:
        """Customer -> arrival times of the answers sent to them, in order."""
        found: dict[str, list[float]] = {}
        for message in self.twilio.messages:
            if MARK in message["body"] and message["sid"] in self.arrived:
                found.setdefault(message["to"], []).append(self.arrived[message["sid"]])
        return found


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://{HOST}:{port}"


async def start_fakes(model_seconds: float) -> Fakes:
    model = FakeOpenAI(first_token_delay=model_seconds, default_reply=REPLY)
    twilio = FakeTwilio(account_sid=TWILIO_SID, auth_token=TWILIO_TOKEN)
    arrived: dict[str, float] = {}

    @web.middleware
    async def stamp(request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        if request.method == "POST" and response.status == 201:
            # The fake records a message the moment it accepts it, and answers at once.
            body = getattr(response, "text", None) or "{}"
            sid = json.loads(body).get("sid")
            if sid:
                arrived[sid] = asyncio.get_running_loop().time()
        return response

    twilio_app = twilio.app()
    twilio_app.middlewares.append(stamp)
    model_runner, model_url = await _serve(model.app())
    twilio_runner, twilio_url = await _serve(twilio_app)
    telegram_runner, telegram_url = await _serve(FakeTelegram().app())
    return Fakes(
        model,
        twilio,
        model_url,
        twilio_url,
        telegram_url,
        [model_runner, twilio_runner, telegram_runner],
        arrived,
    )


# --- the load ---------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    due: dict[str, float] = field(default_factory=dict)  # customer -> when their webhook was due
    acked: set[str] = field(default_factory=set)
    refused: Counter[str] = field(default_factory=Counter)  # what the others got
    lag: list[float] = field(default_factory=list)  # s from due to sent: the client's delay
    drained_in: float = 0.0  # s from the last webhook to the last answer (or the drain's end)


class Customers:
    """Signed WhatsApp webhooks, a new customer (and MessageSid) each."""

    def __init__(self, base: str, first: int) -> None:
        self._base = base
        self._validator = RequestValidator(TWILIO_TOKEN)
        self._number = first - 1

    def next(self) -> tuple[str, bytes, dict[str, str]]:
        self._number += 1
        number = self._number
        customer = f"whatsapp:+3162{number:07d}"
        sid = f"SM{number:032x}"
        fields = {
            "MessageSid": sid,
            "SmsMessageSid": sid,
            "AccountSid": TWILIO_SID,
            "From": customer,
            "To": TWILIO_FROM,
            "Body": QUESTIONS[number % len(QUESTIONS)],
            "NumMedia": "0",
            "ProfileName": "Bench",
            "WaId": customer.removeprefix("whatsapp:+"),
            "MessageType": "text",
            "ApiVersion": "2010-04-01",
        }
        path = f"/webhooks/twilio/{AGENT}"
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": self._validator.compute_signature(self._base + path, fields),
        }
        return customer, urllib.parse.urlencode(fields).encode(), headers


async def fire(
    session: aiohttp.ClientSession,
    customers: Customers,
    base: str,
    phase: Phase,
    rate: float,
    seconds: float,
) -> None:
    """``rate`` webhooks a second for ``seconds``, each sent when due, answered or not."""
    loop = asyncio.get_running_loop()
    total = max(1, round(rate * seconds))
    start = loop.time() + 0.05
    path = f"/webhooks/twilio/{AGENT}"

    async def one(customer: str, body: bytes, headers: dict[str, str], due: float) -> None:
        phase.lag.append(loop.time() - due)
        try:
            async with session.post(base + path, data=body, headers=headers) as response:
                await response.read()
                status = str(response.status)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            status = type(exc).__name__
        if status == "200":
            phase.acked.add(customer)
        else:
            phase.refused[status] += 1

    tasks = []
    for number in range(total):
        customer, body, headers = customers.next()
        due = start + number / rate
        if (delay := due - loop.time()) > 0:
            await asyncio.sleep(delay)
        phase.due[customer] = due
        tasks.append(asyncio.create_task(one(customer, body, headers, due)))
    await asyncio.gather(*tasks)


async def _open_rows(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        count = await conn.fetchval(
            """SELECT (SELECT count(*) FROM inbox WHERE status IN ('pending', 'processing'))
                    + (SELECT count(*) FROM outbox WHERE status NOT IN ('sent', 'failed'))"""
        )
        return int(count)
    finally:
        await conn.close()


async def _until(check: Callable[[], Awaitable[bool]], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.25)
    return False


# --- one setting ------------------------------------------------------------------------------


@dataclass
class Figures:
    name: str
    sent: int
    acked: int
    answered: int
    lost: int
    doubled: int
    holding: int
    waits: list[float]
    refused: Counter[str]
    most_model_calls: int
    drained_in: float
    # Medians, s, of where the answered customers' time went (from the database).
    stages: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU s during the load, per group

    def p(self, percentile: float) -> float:
        if not self.waits:
            return float("nan")
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, round(percentile / 100 * (len(ordered) - 1)))]


async def run_setting(
    name: str,
    args: argparse.Namespace,
    tmp: Path,
    processes: Processes,
    fakes: Fakes,
    database_url: str,
) -> Figures:
    parley = str(Path(sys.executable).with_name("parley"))
    port = free_port()
    env = _gateway_env(tmp / "data", port, fakes.twilio_url, fakes.telegram_url, fakes.model_url)
    env |= SETTINGS[name]
    # Every customer's turn goes to the model: the customers ask the same few questions,
    # which the answer cache would otherwise answer without it after the first.
    env["PARLEY_ANSWER_CACHE"] = "false"
    if args.burst_window is not None:
        env["PARLEY_BURST_WINDOW_SECONDS"] = str(args.burst_window)
    if args.cpu_slots is not None and name == "new":
        env["PARLEY_WORKER_CPU_SLOTS"] = str(args.cpu_slots)
    log = tmp / f"gateway-{name}.log"
    serve = [parley, "serve"]
    if args.layout == "split":
        serve.append("--no-workers")
        processes.start([parley, "worker"], env, tmp, tmp / f"worker-{name}.log")
    gateway = processes.start(serve, env, tmp, log)
    base = f"http://{HOST}:{port}"
    await wait_ready(base, gateway, "parley serve", log)
    # Each setting has customers of its own.
    customers = Customers(base, first=1 + list(SETTINGS).index(name) * 1_000_000)
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=15)
    ) as session:
        warm = Phase(f"{name}-warm-up")
        await fire(session, customers, base, warm, WARM_UP / 2, 2)
        if not await _until(
            _answered_all(fakes, warm),
            60 + (args.burst_window or DEFAULT_WINDOW) + args.model_seconds,
        ):
            print(f"  ({name}: the warm-up was not answered within a minute)", flush=True)
        fakes.model.most_chats_in_flight = 0
        phase = Phase(name)
        meter = _cpu_meter(tmp / "data", processes.pids())
        await fire(session, customers, base, phase, args.rate, args.seconds)
    loop = asyncio.get_running_loop()
    fired = loop.time()
    settled = await _until(_answered_all(fakes, phase), args.drain)
    cpu = meter.used()
    if not settled:
        # Nothing open any more means nothing more will come: the rest is lost, not late.
        await _until(lambda: _nothing_open(database_url), 5)
    answers = fakes.answers()
    last = max((t for c in phase.acked for t in answers.get(c, [])[:1]), default=fired)
    phase.drained_in = last - fired
    processes.stop_all()
    if gateway.returncode not in (0, -15, None):
        print(f"parley serve ({name}) ended with {gateway.returncode}:\n{tail(log)}")
    figures = _figures(phase, answers, fakes)
    figures.stages = await _stages(database_url, sorted(phase.acked))
    figures.cpu = cpu
    return figures


def _cpu_meter(data_dir: Path, parley_pids: list[int]) -> CpuMeter:
    """CPU seconds from now: Parley's processes (and their children), the embedded PostgreSQL
    (its server and backends) and this process."""
    return CpuMeter(
        {"parley": tree_cpu(parley_pids), "postgres": postgres_cpu(data_dir), "bench": own_cpu}
    )


async def _stages(database_url: str, customers: list[str]) -> dict[str, float]:
    """Medians of: came in -> turn started (the burst window, then waiting to be claimed),
    the turn (its model call apart), turn saved -> reply queued, queued -> sent."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            f"""SELECT extract(epoch FROM i.received_at)::float8 AS received,
                       extract(epoch FROM t.created_at)::float8 AS saved,
                       (t.trace->'timings_ms'->>'total')::float8 / 1000 AS turn,
                       (t.trace->'timings_ms'->>'generate')::float8 / 1000 AS generate,
                       extract(epoch FROM o.created_at)::float8 AS queued,
                       extract(epoch FROM o.sent_at)::float8 AS sent
                  FROM inbox i
                  JOIN conversations c ON c.agent_id = i.agent_id AND c.channel = i.channel
                                      AND c.conversation_key = i.conversation_key
                  JOIN turns t ON t.conversation_id = c.id
                  JOIN outbox o ON o.conversation_id = c.id AND o.body LIKE '%{MARK}%'
                 WHERE i.conversation_key = ANY($1::text[]) AND o.sent_at IS NOT NULL""",
            customers,
        )
    finally:
        await conn.close()
    if not rows:
        return {}
    stages = {
        "waiting to start": [r["saved"] - r["turn"] - r["received"] for r in rows],
        "turn without the model": [r["turn"] - r["generate"] for r in rows],
        "model call": [r["generate"] for r in rows],
        "saved to queued": [r["queued"] - r["saved"] for r in rows],
        "queued to sent": [r["sent"] - r["queued"] for r in rows],
    }
    return {name: statistics.median(values) for name, values in stages.items()}


def _answered_all(fakes: Fakes, phase: Phase) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        answers = fakes.answers()
        return bool(phase.acked) and all(c in answers for c in phase.acked)

    return check


async def _nothing_open(database_url: str) -> bool:
    return await _open_rows(database_url) == 0


def _figures(phase: Phase, answers: dict[str, list[float]], fakes: Fakes) -> Figures:
    waits = [answers[c][0] - phase.due[c] for c in phase.acked if c in answers]
    customers = set(phase.due)
    holding = sum(
        1 for m in fakes.twilio.messages if m["to"] in customers and MARK not in m["body"]
    )
    return Figures(
        name=phase.name,
        sent=len(phase.due),
        acked=len(phase.acked),
        answered=sum(1 for c in phase.acked if c in answers),
        lost=sum(1 for c in phase.acked if c not in answers),
        doubled=sum(1 for c in phase.acked if len(answers.get(c, [])) > 1),
        holding=holding,
        waits=waits,
        refused=phase.refused,
        most_model_calls=fakes.model.most_chats_in_flight,
        drained_in=phase.drained_in,
    )


# --- the run ----------------------------------------------------------------------------------


def _report(results: list[Figures], args: argparse.Namespace) -> None:
    window = args.burst_window if args.burst_window is not None else DEFAULT_WINDOW
    print(
        f"\n{args.rate:g} webhooks/s for {args.seconds:g} s, each from a new customer; model "
        f"answers in {args.model_seconds:g} s; burst window {window:g} s (a message waits that "
        f"long for the next of its chat before it is answered: the floor is "
        f"{window + args.model_seconds:g} s)\n"
    )
    rows = [
        ("setting", "sent", "acked", "answered", "lost", "doubled", "holding", "wait p50 s",
         "p99 s", "max s", "model calls at once", "last answer after load s"),
    ]  # fmt: skip
    for f in results:
        rows.append((
            f.name, str(f.sent), str(f.acked), str(f.answered), str(f.lost), str(f.doubled),
            str(f.holding), f"{f.p(50):.2f}", f"{f.p(99):.2f}", f"{max(f.waits, default=0):.2f}",
            str(f.most_model_calls), f"{f.drained_in:.1f}",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
        if number == 0:
            print("  ".join("-" * w for w in widths))
    for f in results:
        if f.refused:
            print(f"  {f.name}: not acknowledged: {dict(f.refused)}")
    print("\nWhere the time went (medians, s, from the database's clock):")
    for f in results:
        print(f"  {f.name}: " + ", ".join(f"{k} {v:.2f}" for k, v in f.stages.items()))
    print(
        "\nCPU time per answer during the load and drain (ms; this process runs the load and the fakes):"
    )
    for f in results:
        per = {k: 1000 * v / max(f.answered, 1) for k, v in f.cpu.items()}
        print(f"  {f.name}: " + ", ".join(f"{k} {v:.0f}" for k, v in per.items()))
    by_name = {f.name: f for f in results}
    if "new" in by_name and "old" in by_name:
        new, old = by_name["new"], by_name["old"]
        if new.waits and old.waits:
            print(
                f"\nold / new: median wait {old.p(50) / new.p(50):.1f}x, "
                f"p99 {old.p(99) / new.p(99):.1f}x"
            )
    _record(results, window + args.model_seconds)


def _record(results: list[Figures], least_wait: float) -> None:
    """The figures `bench.all` keeps: each setting's waits beside the least a wait can be
    (the burst window and the model's answer time), and what was lost or doubled."""
    for f in results:
        if not f.waits:
            continue
        suffix = "" if f.name == "new" else f" ({f.name} settings)"
        record(f"customer wait p50{suffix}", f.p(50), "s", floor=least_wait)
        record(f"customer wait p99{suffix}", f.p(99), "s", floor=least_wait)
        record(f"answers lost or doubled{suffix}", f.lost + f.doubled, "", aim=("<=", 0))
        parley = 1000 * f.cpu.get("parley", 0.0) / max(f.answered, 1)
        record(f"Parley CPU per answer{suffix}", parley, "ms")


async def run(args: argparse.Namespace, tmp: Path, processes: Processes, release: list[Any]) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"machine: {cores} cores available, {platform.machine()}, "
        f"Python {platform.python_version()}; layout: {args.layout}",
        flush=True,
    )
    data_dir = tmp / "data"
    database_url = await start_postgres(data_dir, release)
    fakes = await start_fakes(args.model_seconds)
    release.extend(fakes.runners)
    parley = str(Path(sys.executable).with_name("parley"))
    env = _gateway_env(data_dir, free_port(), fakes.twilio_url, fakes.telegram_url, None)
    commands = [["agent", "create", AGENT]]
    if args.content == "shop":
        commands.append(["ingest", "--agent", AGENT, str(DEMO_SITE)])
    for command in commands:
        done = subprocess.run(
            [parley, *command], env=env, cwd=tmp, capture_output=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"parley {command[0]} failed:\n{done.stderr.decode()}")
    content = "the sample shop ingested" if args.content == "shop" else "no content"
    print(f"agent {AGENT}: {content}", flush=True)
    results = []
    for name in args.settings:
        print(f"setting {name}: {SETTINGS[name] or 'the defaults'}", flush=True)
        results.append(await run_setting(name, args, tmp, processes, fakes, database_url))
        figures = results[-1]
        print(
            f"  answered {figures.answered}/{figures.acked}, median wait {figures.p(50):.2f} s",
            flush=True,
        )
    _report(results, args)
    return 0 if all(f.lost == 0 and f.doubled == 0 for f in results) else 1


def main(args: argparse.Namespace) -> int:
    return run_benchmark("throughput", run, args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=30.0, help="webhooks per second (30)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of load (20)")
    parser.add_argument(
        "--model-seconds", type=float, default=1.0, help="the fake model's answer time (1)"
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        choices=list(SETTINGS),
        default=list(SETTINGS),
        help="which settings to run, in order (default: new old)",
    )
    parser.add_argument(
        "--burst-window",
        type=float,
        help=f"PARLEY_BURST_WINDOW_SECONDS for the gateway (default: {DEFAULT_WINDOW:g})",
    )
    parser.add_argument(
        "--cpu-slots", type=int, help="PARLEY_WORKER_CPU_SLOTS of `new` (default: 4)"
    )
    parser.add_argument(
        "--layout",
        choices=["serve", "split"],
        default="serve",
        help="answer in `parley serve` (default) or in a `parley worker` next to "
        "`parley serve --no-workers`",
    )
    parser.add_argument(
        "--content",
        choices=["shop", "none"],
        default="shop",
        help="the agent's content: the sample shop (default; every turn searches and quotes "
        "real pages) or none (the model answers without sources: the least work a turn does)",
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=300.0,
        help="seconds each setting gets after the load to answer the rest (300)",
    )
    return parser


if __name__ == "__main__":
    parsed = _parser().parse_args()
    if parsed.rate <= 0 or parsed.seconds <= 0 or parsed.model_seconds < 0:
        _parser().error("--rate and --seconds must be > 0, --model-seconds >= 0")
    sys.exit(main(parsed))
