"""Webhook intake under open-loop load: acknowledgement latency and the highest sustained rate.

    .venv/bin/python -m bench.webhooks                          # 200/s and 500/s, 20 s each
    .venv/bin/python -m bench.webhooks --rates 100 --seconds 5 --ramp 200 400 --ramp-seconds 3

`parley serve` runs as a separate process on the embedded defaults (a temp data dir); its
in-process workers answer the inbox and send through fake Twilio and Telegram APIs running in
this process. By default there is no model (the embedded default): the workers quote
sentences, which costs CPU for every answer on the same cores as the intake. With
`--answers llm` the answers come from a fake OpenAI-compatible model served by this process
(200 ms to the first token, 50 tokens/s), whose streams then load the load generator too.
`--layout split` answers in `--workers` `parley worker` processes (1) next to
`parley serve --no-workers`; `--layout http-only` runs `parley serve --no-workers` alone (the
acknowledgement path only). `--profile DIR` records `parley serve` (and the workers) with
py-spy during each fixed rate and prints where its CPU went. `bench/workers.py` measures what
a second worker process adds.

Signed Twilio webhooks and Telegram updates, each one unique, are fired at fixed rates
whatever the answers do (open loop), so latency is counted from the moment a request was due,
queueing in the client included. The floor, in the same run and under the same load, is a
bare aiohttp app in a process of its own whose handler does one asyncpg INSERT into a table of
the same PostgreSQL and answers 200. The floor runs first, while the gateway is idle; the
gateway's phases run with its workers answering the backlog, as `parley serve` does in
production. At the end the inbox must hold exactly one row per acknowledged webhook.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil
from aiohttp import web
from twilio.request_validator import RequestValidator

from bench.all import profile_summary
from bench.figures import record
from bench.rig import (
    Processes,
    cpu_seconds,
    free_port,
    run_benchmark,
    start_postgres,
    tail,
    wait_ready,
)
from bench.turn import start_fake_llm
from gateway.app import POOL_SIZE
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio

AGENT = "bench"
# The fake model of --answers llm: a short reply, at a hosted model's pace.
LLM_TTFT, LLM_RATE = 0.2, 50.0
LLM_REPLY = "Your order ships within 2 working days and returns are free for 30 days [1]."
HOST = "127.0.0.1"
TWILIO_SID = "AC" + "b" * 32
TWILIO_TOKEN = "bench-twilio-auth-token-0123456789"
TWILIO_FROM = "whatsapp:+14155238886"
TELEGRAM_TOKEN = "987654321:AABenchTelegramTokenForParley_x"
TELEGRAM_SECRET = "bench-telegram-secret-0123456789"
CHANNELS = ("twilio", "telegram")
FLOOR_DATABASE = "bench_floor"
# Before anything is measured, each target gets this many requests a second per channel for
# WARM_UP_SECONDS: every code path runs once and the connection pools grow to what load needs.
WARM_UP = 200
WARM_UP_SECONDS = 2
FIRST_ANSWERS = 20  # the workers answer this many before the gateway is measured
QUESTIONS = [
    "How long does delivery to Belgium take?",
    "Hoe lang duurt de levering naar Duitsland?",
    "Welche Zahlungsmethoden gibt es?",
    "Can I return shoes I have worn outside?",
    "Where is my order?",
    "Is the Stormvang jacket waterproof?",
]

# The floor: what one INSERT per request costs on this machine, with nothing else around it.
FLOOR_APP = '''
"""Bench floor: answer any POST with 200 after one INSERT of its body."""

import sys

import asyncpg
from aiohttp import web

URL, PORT, POOL_SIZE = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
POOL = web.AppKey("pool", asyncpg.Pool)


async def pool(app):
    app[POOL] = await asyncpg.create_pool(URL, min_size=POOL_SIZE, max_size=POOL_SIZE)
    yield
    await app[POOL].close()


async def receive(request):
    body = await request.read()
    await request.app[POOL].execute("INSERT INTO floor_inbox (body) VALUES ($1)", body.decode())
    return web.Response(text="ok")


async def ready(request):
    return web.Response(text="ok")


app = web.Application()
app.cleanup_ctx.append(pool)
app.router.add_get("/readyz", ready)
app.router.add_post("/{tail:.*}", receive)
web.run_app(app, host="127.0.0.1", port=PORT, print=None, access_log=None)
'''


# --- the requests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    path: str
    body: bytes
    headers: dict[str, str]


class Requests:
    """Unique, valid deliveries: a new MessageSid / update_id and a new sender each time."""

    def __init__(self, public_url: str) -> None:
        self._public_url = public_url
        self._validator = RequestValidator(TWILIO_TOKEN)
        self._numbers = itertools.count(1)

    def make(self, channel: str) -> Request:
        number = next(self._numbers)
        question = QUESTIONS[number % len(QUESTIONS)]
        if channel == "twilio":
            return self._twilio(number, question)
        return self._telegram(number, question)

    def _twilio(self, number: int, question: str) -> Request:
        sid = f"SM{number:032x}"
        phone = f"+316{number:08d}"
        fields = {
            "SmsMessageSid": sid,
            "NumMedia": "0",
            "ProfileName": "Bench",
            "MessageType": "text",
            "SmsSid": sid,
            "WaId": phone[1:],
            "SmsStatus": "received",
            "Body": question,
            "To": TWILIO_FROM,
            "NumSegments": "1",
            "ReferralNumMedia": "0",
            "MessageSid": sid,
            "AccountSid": TWILIO_SID,
            "From": f"whatsapp:{phone}",
            "ApiVersion": "2010-04-01",
        }
        path = f"/webhooks/twilio/{AGENT}"
        signature = self._validator.compute_signature(self._public_url + path, fields)
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": signature,
        }
        return Request(path, urllib.parse.urlencode(fields).encode(), headers)

    def _telegram(self, number: int, question: str) -> Request:
        user = {"id": 500_000_000 + number, "is_bot": False, "first_name": "Bench"}
        chat = {"id": user["id"], "first_name": "Bench", "type": "private"}
        update = {
            "update_id": number,
            "message": {
                "message_id": number,
                "from": user,
                "chat": chat,
                "date": int(time.time()),
                "text": question,
            },
        }
        headers = {
            "Content-Type": "application/json",
            "X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET,
        }
        return Request(f"/webhooks/telegram/{AGENT}", json.dumps(update).encode(), headers)


# --- open-loop load ---------------------------------------------------------------------------


@dataclass
class Result:
    target: str
    channel: str
    rate: float
    seconds: float
    sent: int = 0
    acked: int = 0
    latencies: list[float] = field(default_factory=list)  # ms, acknowledged requests only
    # ms from due to the request starting out: large values mean the client, not the server,
    # is falling behind.
    lags: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)  # non-200 answers
    timeouts: int = 0
    failures: int = 0  # connection errors
    elapsed: float = 0.0  # s from the first due time to the last answer
    cpu: float = 0.0  # CPU seconds the target's processes used during the phase

    @property
    def cpu_per_request(self) -> float:
        """CPU ms per acknowledged request: less noisy than latency on a shared machine."""
        return 1000 * self.cpu / self.acked if self.acked else float("nan")

    @property
    def errors(self) -> int:
        return sum(self.statuses.values()) + self.timeouts + self.failures

    @property
    def achieved(self) -> float:
        # Over the whole schedule at least: the last request is due 1/rate before its end.
        window = max(self.elapsed, self.sent / self.rate)
        return self.acked / window if window else 0.0

    def p(self, percentile: float) -> float:
        return _percentile(self.latencies, percentile)


def _percentile(values: list[float], percentile: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(percentile / 100 * (len(ordered) - 1)))]


class Target:
    """One server under test, driven through one session with a bounded connection pool."""

    def __init__(
        self,
        name: str,
        base: str,
        connections: int,
        timeout: float,
        pids: list[int],
        profiler: Profiler | None = None,
    ) -> None:
        self.name = name
        self.base = base
        self._connector = aiohttp.TCPConnector(limit=connections)
        self._session = aiohttp.ClientSession(
            connector=self._connector, timeout=aiohttp.ClientTimeout(total=timeout)
        )
        self.acked = Counter[str]()  # every 200 received, warm-up included, per channel
        self._processes = [psutil.Process(pid) for pid in pids]
        self.profiler = profiler

    def cpu_seconds(self) -> float:
        """CPU time used so far by the target's processes (user and system)."""
        return sum(map(cpu_seconds, self._processes))

    async def close(self) -> None:
        await self._session.close()

    async def _one(
        self, request: Request, due: float, start: float, channel: str, result: Result
    ) -> None:
        loop = asyncio.get_running_loop()
        result.lags.append((loop.time() - due) * 1000)
        try:
            async with self._session.post(
                self.base + request.path, data=request.body, headers=request.headers
            ) as response:
                await response.read()
                status = response.status
        except TimeoutError:
            result.timeouts += 1
            return
        except (aiohttp.ClientError, OSError):
            result.failures += 1
            return
        finally:
            answered = loop.time()
            result.elapsed = max(result.elapsed, answered - start)
        if status == 200:
            result.acked += 1
            self.acked[channel] += 1
            result.latencies.append((answered - due) * 1000)
        else:
            result.statuses[status] += 1

    async def drive(self, requests: Requests, channel: str, rate: float, seconds: float) -> Result:
        """Send `rate` requests a second for `seconds`, each at its due time, answered or not."""
        result = Result(self.name, channel, rate, seconds)
        loop = asyncio.get_running_loop()
        total = max(1, round(rate * seconds))
        tasks = []
        start = loop.time() + 0.05
        # A full collection walks every object the imports made and stalls the sender.
        gc.disable()
        cpu = self.cpu_seconds()
        try:
            for number in range(total):
                request = requests.make(channel)  # built and signed before it is due
                due = start + number / rate
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(self._one(request, due, start, channel, result))
                tasks.append(task)
            result.sent = total
            await asyncio.gather(*tasks)
        finally:
            gc.enable()
        result.cpu = self.cpu_seconds() - cpu
        return result


class Profiler:
    """py-spy on given processes while a phase runs: one raw (collapsed stacks) file per phase
    and process in ``directory``, and where the CPU went, printed after the phase."""

    def __init__(self, directory: Path, pids: dict[str, int]) -> None:
        self._directory = directory
        self._pids = pids
        directory.mkdir(parents=True, exist_ok=True)
        self._spy = str(Path(sys.executable).with_name("py-spy"))

    @contextlib.asynccontextmanager
    async def phase(self, name: str) -> AsyncIterator[None]:
        spies = {}
        for process, pid in self._pids.items():
            out = self._directory / f"{name}-{process}.txt"
            argv = [self._spy, "record", "--pid", str(pid), "--rate", "100", "--nonblocking",
                    "--format", "raw", "--output", str(out)]  # fmt: skip
            spies[process] = (out, subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL))  # fmt: skip
        try:
            yield
        finally:
            for _, spy in spies.values():
                spy.send_signal(signal.SIGINT)  # py-spy writes what it has, then exits
            for process, (out, spy) in spies.items():
                await asyncio.to_thread(spy.wait, 30)
                if out.exists():
                    print(f"    profile of {process} ({out}):")
                    for line in profile_summary(out.read_text()):
                        print(f"    {line}")


# --- the fakes and the gateway's settings ----------------------------------------------------


async def _start_fakes() -> tuple[list[web.AppRunner], FakeTwilio, FakeTelegram, str, str]:
    twilio = FakeTwilio(account_sid=TWILIO_SID, auth_token=TWILIO_TOKEN)
    telegram = FakeTelegram(token=TELEGRAM_TOKEN)
    runners, urls = [], []
    for fake in (twilio, telegram):
        runner = web.AppRunner(fake.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        runners.append(runner)
        urls.append(f"http://{HOST}:{port}")
    return runners, twilio, telegram, urls[0], urls[1]


def _gateway_env(
    data_dir: Path, port: int, twilio_api: str, telegram_api: str, llm: str | None
) -> dict[str, str]:
    prefixes = ("PARLEY_", "OPENAI_", "TWILIO_", "TELEGRAM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    if llm is not None:
        env |= {"PARLEY_LLM_BASE_URL": f"{llm}/v1", "PARLEY_LLM_API_KEY": "sk-bench"}
    return env | {
        "PARLEY_DATA_DIR": str(data_dir),
        "PARLEY_HOST": HOST,
        "PARLEY_PORT": str(port),
        "PARLEY_PUBLIC_URL": f"http://{HOST}:{port}",
        "PARLEY_LOG_LEVEL": "WARNING",
        "PARLEY_TWILIO_API_BASE": twilio_api,
        "PARLEY_TELEGRAM_API_BASE": telegram_api,
        "TWILIO_ACCOUNT_SID": TWILIO_SID,
        "TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
        "TWILIO_WHATSAPP_FROM": TWILIO_FROM,
        "TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN,
        "TELEGRAM_WEBHOOK_SECRET": TELEGRAM_SECRET,
    }


def _database_url(url: str, database: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))


async def _create_floor_database(admin_url: str) -> str:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{FLOOR_DATABASE}"')
    finally:
        await conn.close()
    url = _database_url(admin_url, FLOOR_DATABASE)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """CREATE TABLE floor_inbox (
                   id bigserial PRIMARY KEY,
                   body text NOT NULL,
                   received_at timestamptz NOT NULL DEFAULT now())"""
        )
    finally:
        await conn.close()
    return url


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Ramp:
    results: list[Result]

    def highest(self, limit_ms: float) -> float:
        """The highest step passed before the first that failed; 0 when none passed."""
        best = 0.0
        for result in self.results:
            if not _passes(result, limit_ms):
                break
            best = result.rate
        return best


def _passes(result: Result, limit_ms: float) -> bool:
    return result.errors == 0 and result.p(99) < limit_ms


async def _ramp(target: Target, requests: Requests, channel: str, args: argparse.Namespace) -> Ramp:
    """Step up until a step fails: overloading further would measure nothing new."""
    results = []
    for rate in args.ramp:
        result = await target.drive(requests, channel, rate, args.ramp_seconds)
        results.append(result)
        print(f"  {_describe(result)}", flush=True)
        if not _passes(result, args.p99_limit):
            break
        await asyncio.sleep(1)  # let the last step's stragglers and TIME_WAITs settle
    return Ramp(results)


async def _warm_up(target: Target, requests: Requests) -> None:
    """Open the connections and touch every code path once before anything is measured."""
    for channel in CHANNELS:
        result = await target.drive(requests, channel, WARM_UP, WARM_UP_SECONDS)
        if result.errors:
            raise RuntimeError(f"{target.name} refused the warm-up: {_describe(result)}")


async def _wait_first_answers(parley_url: str, within: float) -> None:
    """Until the workers have answered part of the warm-up (loading what a first turn loads);
    the rest of it is answered while the load runs, as a backlog would be."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        done = await _count_rows(
            parley_url, "SELECT 'done', count(*) FROM inbox WHERE status = 'done'"
        )
        if done["done"] >= FIRST_ANSWERS:
            return
        await asyncio.sleep(0.5)
    print(f"  (the workers had not answered {FIRST_ANSWERS} messages within {within:g} s)")


async def _measure(
    target: Target, requests: Requests, args: argparse.Namespace
) -> tuple[dict[tuple[str, float], Result], dict[str, Ramp]]:
    fixed = {}
    for rate in args.rates:
        for channel in args.channels:
            profiling = (
                target.profiler.phase(f"{channel}-{rate:g}")
                if target.profiler is not None
                else contextlib.nullcontext()
            )
            async with profiling:
                result = await target.drive(requests, channel, rate, args.seconds)
            fixed[channel, rate] = result
            print(f"  {_describe(result)}", flush=True)
    ramps = {channel: await _ramp(target, requests, channel, args) for channel in args.channels}
    return fixed, ramps


def _describe(result: Result) -> str:
    errors = f", {result.errors} errors" if result.errors else ""
    return (
        f"{result.target:<7} {result.channel:<8} {result.rate:>6.0f}/s x {result.seconds:g} s: "
        f"{result.acked}/{result.sent} acked, {result.achieved:.0f}/s, "
        f"p50 {result.p(50):.1f} ms, p99 {result.p(99):.1f} ms{errors} "
        f"(client lag p99 {_percentile(result.lags, 99):.1f} ms, "
        f"{result.cpu_per_request:.2f} CPU ms/request)"
    )


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
        if number == 0:
            print("  ".join("-" * w for w in widths))


def _error_text(result: Result) -> str:
    parts = [f"{status}x{count}" for status, count in sorted(result.statuses.items())]
    if result.timeouts:
        parts.append(f"timeout x{result.timeouts}")
    if result.failures:
        parts.append(f"conn x{result.failures}")
    return " ".join(parts) or "0"


def _report(
    gateway: tuple[dict[tuple[str, float], Result], dict[str, Ramp]],
    floor: tuple[dict[tuple[str, float], Result], dict[str, Ramp]],
    args: argparse.Namespace,
) -> None:
    print(f"\nFixed rates, {args.seconds:g} s each (latency: due -> 200 received, ms)\n")
    rows = [
        ("channel", "rate/s", "gateway acked/s", "p50", "p99", "errors", "CPU ms/req",
         "floor acked/s", "p50", "p99", "errors", "CPU ms/req", "rate ratio", "p99 ratio"),
    ]  # fmt: skip
    for rate in args.rates:
        for channel in args.channels:
            g, f = gateway[0][channel, rate], floor[0][channel, rate]
            rows.append((
                channel, f"{rate:g}",
                f"{g.achieved:.0f}", f"{g.p(50):.1f}", f"{g.p(99):.1f}", _error_text(g),
                f"{g.cpu_per_request:.2f}",
                f"{f.achieved:.0f}", f"{f.p(50):.1f}", f"{f.p(99):.1f}", _error_text(f),
                f"{f.cpu_per_request:.2f}",
                f"{g.achieved / f.achieved:.2f}" if f.achieved else "-",
                f"{g.p(99) / f.p(99):.1f}x" if f.latencies and g.latencies else "-",
            ))  # fmt: skip
            # The aim for intake alone: p99 < 20 ms at 500/s (the answering shares the
            # cores in the other layouts, where the ramp's ratio is the aim).
            aim = ("<", 20.0) if args.layout == "http-only" and rate == 500 else None
            record(f"{channel} p99 at {rate:g}/s", g.p(99), "ms", floor=f.p(99), aim=aim)
    _print_table(rows)
    print(
        "(CPU ms/req: the CPU time of `parley serve` (its in-process workers included) or of "
        "the floor's process, per acknowledged request; less noisy than latency when other "
        "work shares the cores)"
    )

    print(
        f"\nRamp, {args.ramp_seconds:g} s a step: highest rate with p99 < {args.p99_limit:g} ms "
        "and no errors (stops at the first step that fails)\n"
    )
    rows = [("channel", "rate/s", "gateway p99", "errors", "floor p99", "errors")]
    for channel in args.channels:
        g_steps, f_steps = gateway[1][channel].results, floor[1][channel].results
        for step, rate in enumerate(args.ramp):
            if step >= len(g_steps) and step >= len(f_steps):
                break
            g = g_steps[step] if step < len(g_steps) else None
            f = f_steps[step] if step < len(f_steps) else None
            rows.append((
                channel, f"{rate:g}",
                f"{g.p(99):.1f}" if g else "-", _error_text(g) if g else "-",
                f"{f.p(99):.1f}" if f else "-", _error_text(f) if f else "-",
            ))  # fmt: skip
    _print_table(rows)
    print()
    for channel in args.channels:
        g_best = gateway[1][channel].highest(args.p99_limit)
        f_best = floor[1][channel].highest(args.p99_limit)
        top = args.ramp[-1]
        if f_best == 0:
            ratio = "-"
        elif f_best == top:  # the floor's real limit is higher: only a bound is known
            ratio = "- (raise --ramp)" if g_best == top else f"<= {g_best / f_best:.2f}"
        else:
            ratio = f"{g_best / f_best:.2f}"
        print(
            f"highest sustained {channel:<8}  gateway {_sustained(g_best, args.ramp)}, "
            f"floor {_sustained(f_best, args.ramp)}, ratio {ratio}"
        )
        # With the workers answering, the gateway should sustain >= 0.6x the floor's rate.
        ratio_aim = None if args.layout == "http-only" else (">=", 0.6)
        record(
            f"{channel} highest sustained rate",
            g_best,
            "/s",
            floor=f_best or None,
            ratio_aim=ratio_aim,
        )


def _sustained(best: float, steps: list[float]) -> str:
    if best == 0:
        return f"< {steps[0]:g}/s"
    if best == steps[-1]:
        return f">= {best:g}/s (the top step)"
    return f"{best:g}/s"


async def _count_rows(url: str, query: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        return {str(key): int(count) for key, count in await conn.fetch(query)}
    finally:
        await conn.close()


async def _answered(parley_url: str) -> int:
    done = "SELECT 'done', count(*) FROM inbox WHERE status NOT IN ('pending', 'processing')"
    return (await _count_rows(parley_url, done))["done"]


async def _verify(
    parley_url: str, floor_url: str, gateway: Target, floor: Target, timeouts: int
) -> bool:
    """One inbox row per acknowledged webhook: no acknowledged delivery lost, none doubled."""
    if timeouts:
        # A request the client gave up on may still be written; give it time to land.
        await asyncio.sleep(5)
    stored = await _count_rows(parley_url, "SELECT channel, count(*) FROM inbox GROUP BY channel")
    statuses = await _count_rows(parley_url, "SELECT status, count(*) FROM inbox GROUP BY status")
    floor_rows = (await _count_rows(floor_url, "SELECT 'all', count(*) FROM floor_inbox"))["all"]
    ok = True
    print("\nInbox check (rows in the gateway's database vs 200s received)")
    for channel, stored_as in (("twilio", "whatsapp"), ("telegram", "telegram")):
        rows, acked = stored.get(stored_as, 0), gateway.acked[channel]
        same = rows == acked
        ok &= same
        print(f"  {channel:<8} acked {acked:>7}  rows {rows:>7}  {'ok' if same else 'MISMATCH'}")
    floor_acked = sum(floor.acked.values())
    same = floor_rows == floor_acked
    ok &= same
    print(
        f"  floor    acked {floor_acked:>7}  rows {floor_rows:>7}  {'ok' if same else 'MISMATCH'}"
    )
    if not ok and timeouts:
        print(f"  ({timeouts} requests timed out: each may have been stored without a 200)")
    print("  inbox rows by status: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    errors = await _count_rows(
        parley_url,
        "SELECT left(error, 200), count(*) FROM inbox WHERE error IS NOT NULL GROUP BY 1 "
        "ORDER BY 2 DESC LIMIT 5",
    )
    for error, count in errors.items():
        print(f"  {count} rows failed (or are being tried again) with: {error}")
    return ok


async def run(args: argparse.Namespace, tmp: Path, processes: Processes, release: list[Any]) -> int:
    data_dir = tmp / "data"
    python = sys.executable
    parley = str(Path(python).with_name("parley"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"machine: {cores} cores available ({os.cpu_count()} online), {platform.machine()}, "
        f"Python {platform.python_version()}, aiohttp {aiohttp.__version__}"
    )
    print(
        f"load: open loop on {HOST}, at most {args.connections} connections per target, "
        f"{args.timeout:g} s timeout; the gateway and the floor use {POOL_SIZE} DB connections\n",
        flush=True,
    )

    # Held for the whole run: the gateway, the CLI and the floor all join this one server.
    parley_url = await start_postgres(data_dir, release)
    floor_url = await _create_floor_database(_database_url(parley_url, "postgres"))

    runners, fake_twilio, fake_telegram, twilio_api, telegram_api = await _start_fakes()
    release.extend(runners)
    port, floor_port = free_port(), free_port()
    llm = None
    if args.answers == "llm":
        llm_runner, llm = await start_fake_llm(LLM_TTFT, LLM_RATE, LLM_REPLY)
        release.append(llm_runner)
    env = _gateway_env(data_dir, port, twilio_api, telegram_api, llm)
    created = subprocess.run(
        [parley, "agent", "create", AGENT], env=env, cwd=tmp, capture_output=True, check=False
    )
    if created.returncode != 0:
        raise RuntimeError(f"parley agent create failed:\n{created.stderr.decode()}")

    gateway_log, floor_log = tmp / "gateway.log", tmp / "floor.log"
    serve = [parley, "serve"]
    if args.layout != "one-process":
        serve.append("--no-workers")
    workers = []
    if args.layout == "split":
        workers = [
            processes.start([parley, "worker"], env, tmp, tmp / f"worker-{n + 1}.log")
            for n in range(args.workers)
        ]
    gateway_process = processes.start(serve, env, tmp, gateway_log)
    (tmp / "floor.py").write_text(textwrap.dedent(FLOOR_APP))
    floor_argv = [python, str(tmp / "floor.py"), floor_url, str(floor_port), str(POOL_SIZE)]
    floor_process = processes.start(floor_argv, dict(os.environ), tmp, floor_log)
    gateway_base, floor_base = f"http://{HOST}:{port}", f"http://{HOST}:{floor_port}"
    await wait_ready(gateway_base, gateway_process, "parley serve", gateway_log)
    await wait_ready(floor_base, floor_process, "the floor app", floor_log)

    gc.freeze()  # what is loaded by now lives until the end: no collection needs to walk it
    requests = Requests(public_url=gateway_base)
    profiler = None
    if args.profile is not None:
        profiled = {"serve": gateway_process.pid}
        profiled |= {f"worker-{n + 1}": w.pid for n, w in enumerate(workers)}
        profiler = Profiler(args.profile, profiled)
    gateway = Target(
        "gateway", gateway_base, args.connections, args.timeout, [gateway_process.pid], profiler
    )
    floor = Target("floor", floor_base, args.connections, args.timeout, [floor_process.pid])
    release.extend([gateway, floor])
    # The floor first, while the gateway is idle: its workers answer the backlog afterwards.
    print("floor: one asyncpg INSERT per request", flush=True)
    await _warm_up(floor, requests)
    floor_results = await _measure(floor, requests, args)
    answering = "a fake model" if args.answers == "llm" else "extractively, no model"
    where = {
        "one-process": f"workers answering in-process ({answering})",
        "split": f"workers answering in {args.workers} `parley worker` process(es) ({answering})",
        "http-only": "--no-workers, nothing answering (the acknowledgement path alone)",
    }[args.layout]
    print(f"gateway: parley serve, {where}", flush=True)
    await _warm_up(gateway, requests)
    if args.layout != "http-only":
        await _wait_first_answers(parley_url, 60)
    answered_before = await _answered(parley_url)
    started = time.monotonic()
    gateway_results = await _measure(gateway, requests, args)
    answered = await _answered(parley_url) - answered_before
    load_seconds = time.monotonic() - started

    _report(gateway_results, floor_results, args)
    timeouts = sum(
        r.timeouts
        for results in (gateway_results, floor_results)
        for r in itertools.chain(
            results[0].values(), *(ramp.results for ramp in results[1].values())
        )
    )
    ok = await _verify(parley_url, floor_url, gateway, floor, timeouts)
    print(
        f"  the workers answered {answered} rows during the gateway's "
        f"{load_seconds:.0f} s of load ({answered / load_seconds:.1f}/s)"
    )
    print(
        f"  replies sent so far through the fakes: whatsapp {len(fake_twilio.messages)}, "
        f"telegram {len(fake_telegram.messages)}"
    )
    if gateway_process.poll() is not None:
        print(f"parley serve exited early:\n{tail(gateway_log)}")
        ok = False
    return 0 if ok else 1


def main(args: argparse.Namespace) -> int:
    return run_benchmark("webhooks", run, args)


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return number


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rates",
        type=_positive,
        nargs="+",
        default=[200.0, 500.0],
        help="fixed rates per channel, requests/s (default: 200 500)",
    )
    parser.add_argument(
        "--seconds", type=_positive, default=20.0, help="seconds per fixed rate (default: 20)"
    )
    parser.add_argument(
        "--ramp",
        type=_positive,
        nargs="+",
        default=[200.0, 400.0, 800.0, 1600.0, 2400.0, 3200.0],
        help="ramp steps, requests/s (default: 200 400 800 1600 2400 3200)",
    )
    parser.add_argument(
        "--ramp-seconds", type=_positive, default=5.0, help="seconds per ramp step (default: 5)"
    )
    parser.add_argument(
        "--p99-limit",
        type=_positive,
        default=100.0,
        help="a ramp step passes with p99 under this many ms (default: 100)",
    )
    parser.add_argument(
        "--answers",
        choices=["llm", "extractive"],
        default="extractive",
        help="how the gateway's workers answer: extractively (default) or with a fake model",
    )
    parser.add_argument(
        "--layout",
        choices=["one-process", "split", "http-only"],
        default="one-process",
        help="`parley serve` answering in-process (default), `parley serve --no-workers` next "
        "to a `parley worker` process, or `parley serve --no-workers` alone",
    )
    parser.add_argument(
        "--channels",
        nargs="+",
        choices=CHANNELS,
        default=list(CHANNELS),
        help="channels measured at each rate, in this order (default: twilio telegram)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="`parley worker` processes of --layout split (default: 1)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="record `parley serve` (and the workers) with py-spy during each fixed rate; "
        "raw stacks in DIR, where the CPU went printed after each rate",
    )
    parser.add_argument(
        "--connections", type=int, default=64, help="client connections per target (default: 64)"
    )
    parser.add_argument(
        "--timeout",
        type=_positive,
        default=5.0,
        help="seconds before a request counts as timed out (default: 5)",
    )
    return parser


def _check(args: argparse.Namespace) -> Iterator[str]:
    if args.connections < 1 or args.connections > 1000:
        yield "--connections must be 1-1000"
    if not 1 <= args.workers <= 8:
        yield "--workers must be 1-8"
    if args.workers != 1 and args.layout != "split":
        yield "--workers goes with --layout split"
    if max(args.rates + args.ramp) > 5000:
        yield "rates above 5000/s are more than one client process can offer"
    if max(args.seconds, args.ramp_seconds) > 120:
        yield "phases are limited to 120 s"


if __name__ == "__main__":
    parser = _parser()
    parsed = parser.parse_args()
    parsed.ramp.sort()
    if problems := list(_check(parsed)):
        parser.error("; ".join(problems))
    sys.exit(main(parsed))
