"""Fault runs against real `parley serve` and `parley worker` processes, counted per customer.

`Rig` starts `parley serve --no-workers` (webhooks and the widget) and `parley worker` (the
inbox worker and the outbox sender) as subprocesses on one PostgreSQL and a Redis server of
its own. A fake model and fake Twilio and Telegram APIs run on a thread of this process, so a
scenario can fail them on command while the processes run. Load is open loop: signed webhooks
at a fixed rate, each message from a customer of its own and carrying a reference that the fake
model repeats in its answer. A run ends when nothing is left to do (no open inbox or outbox
row); `Tally` then counts, per customer, what the fake providers received: the answer once,
never (lost), more than once (doubled) or someone else's (misdirected), and the holding
message (at most once, never after the answer).

The scenarios, one per row of the fault table in docs/RELIABILITY.md, live here too: the
tests (tests/integration/test_faults.py) run them short, `bench/faults.py` long.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import subprocess
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp
import asyncpg
from aiohttp import web
from twilio.request_validator import RequestValidator

from core.answer.phrases import LANGUAGES, phrase
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.support.cli import PARLEY, clean_env
from tests.support.services import RedisServer, free_port
from tests.support.sse import Stream, chat

T = TypeVar("T")

HOST = "127.0.0.1"
AGENT = "shop"
MODEL = "gpt-faults"
TWILIO_SID = "AC" + "f" * 32
TWILIO_TOKEN = "faults-twilio-auth-token-0123456789"
TWILIO_FROM = "whatsapp:+14155238886"
TELEGRAM_TOKEN = "555000111:AAFaultsTelegramTokenForParley_xy"
TELEGRAM_SECRET = "faults-telegram-secret-0123456789"
Channel = Literal["whatsapp", "telegram"]
CHANNELS: tuple[Channel, ...] = ("whatsapp", "telegram")
PAGES = [
    {"url": "https://shop.example/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive within 2-3 working days. Shipping costs "
             "4.95 euro and is free from 50 euro."},
    {"url": "https://shop.example/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within "
             "5 working days."},
]  # fmt: skip
QUESTIONS = [
    "How long does delivery to Belgium take?",
    "How much does shipping cost?",
    "Within how many days can I return something?",
]
# Every message carries one; the fake model's answer repeats the one it was asked about.
_REF = re.compile(r"\bref-\d{6}\b")
HOLDING = frozenset(phrase("holding", language) for language in LANGUAGES)
# Default environment of the processes; a rig's own values override these.
BASE_ENV = {"PARLEY_LOG_LEVEL": "INFO"}


def answer_for(body: Mapping[str, Any]) -> str:
    """The fake model's reply: a short cited answer naming the reference it was asked about."""
    asked = [str(m.get("content", "")) for m in body.get("messages", []) if m.get("role") == "user"]
    refs = _REF.findall(asked[-1]) if asked else []
    about = refs[-1] if refs else "no reference"
    return f"Orders to Belgium arrive within 2-3 working days [1]. (Answer to {about}.)"


# --- what was sent, what arrived ---------------------------------------------------------------


@dataclass
class Message:
    """One customer's one message, as the load generator sent it."""

    channel: Channel
    customer: str  # `whatsapp:+316...` or the Telegram chat id
    ref: str
    due: float  # loop time the webhook was due
    acknowledged: bool = False
    statuses: list[int | str] = field(default_factory=list)  # each delivery attempt's answer


@dataclass(frozen=True)
class Delivery:
    at: float  # loop time the watcher first saw it at the fake provider
    text: str


@dataclass
class Tally:
    """Per customer: answered once, lost (never answered), doubled (answered more than once)."""

    scenario: str
    sent: int
    acknowledged: int
    answered_once: int
    lost: int
    doubled: int
    # Answers that carry another message's reference: a reply sent to the wrong customer.
    misdirected: int
    held: int  # customers who got the holding message (once)
    held_twice: int
    held_late: int  # customers who got the holding message after their answer
    waits: list[float]  # seconds from the webhook being due to its answer, answered ones
    problems: list[str] = field(default_factory=list)  # which customers, for a failing check
    note: str = ""  # the state of the inbox, outbox and processes when a check failed
    # What the scenario did, e.g. {"leases expired": [(inbox rows, outbox rows), ...]}.
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """Everything acknowledged, and every acknowledged message answered exactly once."""
        return (
            self.acknowledged == self.sent
            and self.answered_once == self.acknowledged
            and self.lost == self.doubled == self.misdirected == 0
            and self.held_twice == self.held_late == 0
        )

    def wait(self, percentile: float) -> float:
        if not self.waits:
            return float("nan")
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, round(percentile / 100 * (len(ordered) - 1)))]

    def describe(self) -> str:
        lines = [
            f"{self.scenario}: sent {self.sent}, acknowledged {self.acknowledged}, answered "
            f"once {self.answered_once}, lost {self.lost}, doubled {self.doubled}, misdirected "
            f"{self.misdirected}, held {self.held} (twice {self.held_twice}, after the answer "
            f"{self.held_late}), wait p50 "
            f"{self.wait(50):.1f} s p99 {self.wait(99):.1f} s",
            *self.problems[:20],
        ]
        lines += [f"{name}: {value}" for name, value in self.facts.items()]
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


def tally(
    scenario: str, messages: Iterable[Message], delivered: Mapping[str, list[Delivery]]
) -> Tally:
    sent = list(messages)
    acknowledged = [m for m in sent if m.acknowledged]
    result = Tally(scenario, len(sent), len(acknowledged), 0, 0, 0, 0, 0, 0, 0, [])
    for message in sent:
        if not message.acknowledged:
            result.problems.append(f"not acknowledged: {message.customer} {message.statuses}")
    for message in acknowledged:
        arrived = delivered.get(message.customer, [])
        holding = [d for d in arrived if d.text.strip() in HOLDING]
        answers = [d for d in arrived if d.text.strip() not in HOLDING]
        if len(holding) == 1:
            result.held += 1
        elif len(holding) > 1:
            result.held_twice += 1
            result.problems.append(f"held {len(holding)} times: {message.customer}")
        if holding and answers and arrived.index(holding[-1]) > arrived.index(answers[0]):
            result.held_late += 1
            result.problems.append(f"told to hold on after the answer: {message.customer}")
        wrong = [a for a in answers if message.ref not in a.text]
        if wrong:
            result.misdirected += 1
            result.problems.append(f"misdirected to {message.customer}: {wrong[0].text!r}")
        if not answers:
            result.lost += 1
            result.problems.append(f"lost: {message.customer} ({message.ref})")
        elif len(answers) > 1:
            result.doubled += 1
            result.problems.append(f"answered {len(answers)} times: {message.customer}")
        else:
            result.answered_once += 1
        if answers:
            result.waits.append(answers[0].at - message.due)
    return result


@dataclass
class WidgetTally:
    """Widget chats: answered (HTTP 200 and a `done` with the answer) or failed, by reason."""

    scenario: str
    chats: int
    answered: int
    failures: Counter[str]
    seconds: list[float]  # each answered chat's duration

    @property
    def clean(self) -> bool:
        return self.answered == self.chats

    def describe(self) -> str:
        failed = ", ".join(f"{reason} x{n}" for reason, n in self.failures.items()) or "none"
        slowest = max(self.seconds, default=float("nan"))
        return (
            f"{self.scenario}: {self.answered} of {self.chats} widget chats answered, "
            f"failures: {failed}, slowest {slowest:.2f} s"
        )


# --- the rig -----------------------------------------------------------------------------------


class _LoopThread:
    """An event loop on a thread of its own: the fakes keep answering while the caller blocks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fault-rig")
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


class _Fakes:
    """The fake model, Twilio and Telegram, each on its own port of 127.0.0.1."""

    def __init__(self) -> None:
        self.model = FakeOpenAI(responder=answer_for)
        self.twilio = FakeTwilio(account_sid=TWILIO_SID, auth_token=TWILIO_TOKEN)
        self.telegram = FakeTelegram(token=TELEGRAM_TOKEN)
        self.model_port = free_port()
        self._model_runner: web.AppRunner | None = None
        self._runners: list[web.AppRunner] = []
        self.twilio_url = ""
        self.telegram_url = ""

    @property
    def model_url(self) -> str:
        return f"http://{HOST}:{self.model_port}"

    async def start(self) -> None:
        urls = []
        for fake in (self.twilio, self.telegram):
            runner = web.AppRunner(fake.app(), access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            site = web.TCPSite(runner, HOST, 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._runners.append(runner)
            urls.append(f"http://{HOST}:{port}")
        self.twilio_url, self.telegram_url = urls
        await self.model_up()

    async def model_up(self) -> None:
        """The model listens (again) on its port."""
        if self._model_runner is None:
            runner = web.AppRunner(self.model.app(), access_log=None, shutdown_timeout=1.0)
            await runner.setup()
            await web.TCPSite(runner, HOST, self.model_port, reuse_address=True).start()
            self._model_runner = runner

    async def model_gone(self) -> None:
        """Nothing listens on the model's port: connections are refused, open ones closed."""
        runner, self._model_runner = self._model_runner, None
        if runner is not None:
            await runner.cleanup()

    def heal(self) -> None:
        """Every fault off: the model answers at once, the providers answer at once."""
        self.model.chat_down_with = None
        self.model.hang = False
        self.model.first_token_delay = 0.0
        self.model.token_delay = 0.0
        self.twilio.answer_late_by = 0.0
        self.telegram.answer_late_by = 0.0

    async def close(self) -> None:
        await self.model_gone()
        for runner in self._runners:
            await runner.cleanup()


class Process:
    """One `parley` subprocess with its log file."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], workdir: Path) -> None:
        self.name = name
        self.log = workdir / f"{name}.log"
        with self.log.open("ab") as out:
            self._log_start = out.tell()  # where this process's own lines begin
            self.popen = subprocess.Popen(
                [PARLEY, *args],
                cwd=workdir,
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def said(self, text: str) -> int:
        """How many times its log (of every process of this name so far) says ``text``."""
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace").count(text)
        return 0

    def said_since_start(self, text: str) -> int:
        """How many times this process (not an earlier one of its name) says ``text``."""
        with contextlib.suppress(OSError), self.log.open("rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace").count(text)
        return 0

    def tail(self, lines: int = 25) -> str:
        try:
            kept = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return "\n".join(f"  {line}" for line in kept)

    def kill(self) -> None:
        """SIGKILL: no goodbye, nothing released."""
        if self.alive():
            self.popen.kill()
        self.popen.wait()

    def stop(self) -> None:
        if self.alive():
            self.popen.terminate()
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class Rig:
    """The processes, the fakes, the load generator and the tallies of one fault run.

    Use as a context manager. ``env`` adds settings of the processes (e.g. short holding and
    send timeouts for tests); everything else is production's default. Scenarios are
    coroutines run on the rig's own loop with `run`.
    """

    def __init__(
        self,
        workdir: Path,
        database_url: str,
        redis: RedisServer,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.database_url = database_url
        self.redis = redis
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self._extra_env = dict(env or {})
        self._thread: _LoopThread | None = None
        self.fakes: _Fakes | None = None
        self.gateway: Process | None = None
        self.worker: Process | None = None
        self._pool: asyncpg.Pool | None = None
        self._http: aiohttp.ClientSession | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._seen = {"whatsapp": 0, "telegram": 0}
        self.delivered: dict[str, list[Delivery]] = {}  # by customer
        self.arrivals: list[tuple[Channel, float]] = []  # every reply, when it arrived
        self._numbers = itertools.count(1)
        self._validator = RequestValidator(TWILIO_TOKEN)
        self.widget_key = ""

    # -- life cycle ---------------------------------------------------------------------------

    def __enter__(self) -> Rig:
        self._thread = _LoopThread()
        try:
            self.run(self._start(), timeout=300)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, work: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``work`` on the rig's loop (where the fakes live) and return its result."""
        assert self._thread is not None, "use the rig as a context manager"
        return self._thread.run(work, timeout)

    def close(self) -> None:
        for process in (self.worker, self.gateway):
            if process is not None:
                process.stop()
        if self._thread is not None:
            with contextlib.suppress(Exception):
                self._thread.run(self._close(), timeout=60)
            self._thread.close()
            self._thread = None

    @property
    def env(self) -> dict[str, str]:
        fakes = self._fakes
        return clean_env(
            **{
                **BASE_ENV,
                "PARLEY_DATABASE_URL": self.database_url,
                "PARLEY_REDIS_URL": self.redis.url,
                "PARLEY_REDIS_PREFIX": "faults:",
                "PARLEY_DATA_DIR": str(self.workdir / "data"),
                "PARLEY_HOST": HOST,
                "PARLEY_PORT": str(self.port),
                "PARLEY_PUBLIC_URL": self.url,
                "PARLEY_LLM_BASE_URL": f"{fakes.model_url}/v1",
                "PARLEY_LLM_API_KEY": "sk-faults",
                "PARLEY_LLM_MODEL": MODEL,
                "PARLEY_TWILIO_API_BASE": fakes.twilio_url,
                "PARLEY_TELEGRAM_API_BASE": fakes.telegram_url,
                "TWILIO_ACCOUNT_SID": TWILIO_SID,
                "TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
                "TWILIO_WHATSAPP_FROM": TWILIO_FROM,
                "TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN,
                "TELEGRAM_WEBHOOK_SECRET": TELEGRAM_SECRET,
                **self._extra_env,
            }
        )

    @property
    def _fakes(self) -> _Fakes:
        assert self.fakes is not None
        return self.fakes

    @property
    def model(self) -> FakeOpenAI:
        return self._fakes.model

    @property
    def twilio(self) -> FakeTwilio:
        return self._fakes.twilio

    async def _start(self) -> None:
        await self._prepare()
        await self._launch()

    async def _prepare(self) -> None:
        """The fakes, the agent and its pages, and the watcher: all but Parley's processes."""
        self.fakes = _Fakes()
        await self.fakes.start()
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self._pool = await asyncpg.create_pool(self.database_url, min_size=1, max_size=2)
        await self._cli("agent", "create", AGENT)
        pages = self.workdir / "pages.jsonl"
        pages.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
        await self._cli("ingest", "--agent", AGENT, str(pages))
        self.widget_key = await self._pool.fetchval(
            "SELECT widget_key FROM agents WHERE slug = $1", AGENT
        )
        self._watcher = asyncio.create_task(self._watch())

    async def _launch(self) -> None:
        """One gateway answering with its in-process workers, and one `parley worker`."""
        await asyncio.gather(self.start_gateway(), self.start_worker())

    async def _close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._http is not None:
            await self._http.close()
        if self._pool is not None:
            await self._pool.close()
        if self.fakes is not None:
            await self.fakes.close()

    async def _cli(self, *args: str) -> str:
        done = await asyncio.to_thread(
            subprocess.run,
            [PARLEY, *args],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"parley {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    async def start_gateway(self) -> None:
        """`parley serve --no-workers`, once it answers /readyz."""
        self.gateway = Process("serve", ["serve", "--no-workers"], self.env, self.workdir)
        await self._ready(self.gateway, f"{self.url}/readyz")

    async def start_worker(self) -> None:
        """`parley worker`, once it says it started."""
        self.worker = Process("worker", ["worker"], self.env, self.workdir)
        await self._started(self.worker)

    async def _ready(self, process: Process, url: str) -> None:
        """Wait until ``url`` answers 200, or fail with the process's last lines."""
        assert self._http is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited:\n{process.tail()}")
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with self._http.get(url) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{process.name} was not ready in 120 s:\n{process.tail()}")

    async def _started(self, worker: Process) -> None:
        """Wait until a worker logs that it started."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if not worker.alive():
                raise RuntimeError(f"{worker.name} exited:\n{worker.tail()}")
            if worker.said_since_start("worker.started"):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{worker.name} did not start in 120 s:\n{worker.tail()}")

    async def kill_worker(self) -> None:
        """SIGKILL the worker: its claims stay leased, a send it had begun stays 'sending'."""
        assert self.worker is not None
        await asyncio.to_thread(self.worker.kill)

    async def held_rows(self) -> tuple[int, int]:
        """Inbox messages being answered and outbox parts being sent, under live leases."""
        assert self._pool is not None
        inbox = await self._pool.fetchval(
            "SELECT count(*) FROM inbox WHERE status = 'processing' AND lease_until > now()"
        )
        outbox = await self._pool.fetchval(
            "SELECT count(*) FROM outbox WHERE status = 'sending' AND lease_until > now()"
        )
        return int(inbox), int(outbox)

    async def expire_leases(self) -> tuple[int, int]:
        """The leases of a worker that is gone run out now instead of in a minute: what the
        clock would do, without the wait. Only for leases no live process holds."""
        assert self._pool is not None
        inbox = await self._pool.execute(
            "UPDATE inbox SET lease_until = now() WHERE status = 'processing'"
        )
        outbox = await self._pool.execute(
            "UPDATE outbox SET lease_until = now() WHERE status = 'sending'"
        )
        return int(inbox.split()[-1]), int(outbox.split()[-1])

    async def heal(self) -> None:
        """Every fault off and every part running: the start of a scenario."""
        self._fakes.heal()
        await self._fakes.model_up()
        await asyncio.to_thread(self.redis.start)
        if self.gateway is None or not self.gateway.alive():
            await self.start_gateway()
        if self.worker is None or not self.worker.alive():
            await self.start_worker()

    # -- load -----------------------------------------------------------------------------------

    def _customer(self, channel: Channel, number: int) -> str:
        if channel == "whatsapp":
            return f"whatsapp:+316{number:08d}"
        return str(700_000_000 + number)

    def _webhook(self, message: Message, number: int) -> tuple[str, dict[str, Any]]:
        question = f"{QUESTIONS[number % len(QUESTIONS)]} My reference is {message.ref}."
        if message.channel == "whatsapp":
            sid = f"SM{number:032x}"
            fields = {
                "MessageSid": sid, "SmsMessageSid": sid, "AccountSid": TWILIO_SID,
                "From": message.customer, "To": TWILIO_FROM, "Body": question,
                "NumMedia": "0", "ProfileName": "Customer", "WaId": message.customer[10:],
                "MessageType": "text", "ApiVersion": "2010-04-01",
            }  # fmt: skip
            path = f"/webhooks/twilio/{AGENT}"
            signature = self._validator.compute_signature(self.url + path, fields)
            return path, {
                "data": urllib.parse.urlencode(fields),
                "headers": {
                    "Content-Type": "application/x-www-form-urlencoded",
                    "X-Twilio-Signature": signature,
                },
            }
        chat_id = int(message.customer)
        update = {
            "update_id": number,
            "message": {
                "message_id": number,
                "date": int(time.time()),
                "text": question,
                "from": {"id": chat_id, "is_bot": False, "first_name": "Customer"},
                "chat": {"id": chat_id, "first_name": "Customer", "type": "private"},
            },
        }
        return f"/webhooks/telegram/{AGENT}", {
            "data": json.dumps(update),
            "headers": {
                "Content-Type": "application/json",
                "X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET,
            },
        }

    async def send(self, channel: Channel, due: float | None = None) -> Message:
        """One new customer's message; a delivery that is not acknowledged is made again, as
        the providers do, a few times."""
        loop = asyncio.get_running_loop()
        number = next(self._numbers)
        message = Message(
            channel, self._customer(channel, number), f"ref-{number:06d}", due or loop.time()
        )
        path, request = self._webhook(message, number)
        assert self._http is not None
        for _ in range(4):
            try:
                async with self._http.post(self.url + path, **request) as response:
                    await response.read()
                    message.statuses.append(response.status)
                    if response.status == 200:
                        message.acknowledged = True
                        return message
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                message.statuses.append(type(exc).__name__)
            await asyncio.sleep(1.0)
        return message

    async def load(
        self, rate: float, seconds: float, channels: tuple[Channel, ...] = CHANNELS
    ) -> list[Message]:
        """``rate`` messages a second for ``seconds``, each sent when due, whatever the
        answers do; the channels take turns."""
        loop = asyncio.get_running_loop()
        total = max(1, round(rate * seconds))
        start = loop.time()
        tasks = []
        for number in range(total):
            due = start + number / rate
            await asyncio.sleep(max(0.0, due - loop.time()))
            channel = channels[number % len(channels)]
            tasks.append(asyncio.create_task(self.send(channel, due)))
        return list(await asyncio.gather(*tasks))

    async def widget(self, text: str, session: str) -> Stream:
        return await chat(self.url, AGENT, text, key=self.widget_key, session_id=session)

    # -- outcome --------------------------------------------------------------------------------

    async def _watch(self) -> None:
        """Notes when each reply reached a fake provider (its wait), every 20 ms."""
        while True:
            self.look()
            await asyncio.sleep(0.02)

    def look(self) -> None:
        """Notes the replies that reached a fake provider since the last look."""
        now = asyncio.get_running_loop().time()
        fakes = self._fakes
        found: list[tuple[Channel, list[tuple[str, str]]]] = [
            ("whatsapp", [(m["to"], m["body"]) for m in fakes.twilio.messages]),
            ("telegram", [(str(m["chat_id"]), m["text"]) for m in fakes.telegram.messages]),
        ]
        for channel, messages in found:
            for customer, text in messages[self._seen[channel] :]:
                self.delivered.setdefault(customer, []).append(Delivery(now, text))
                self.arrivals.append((channel, now))
            self._seen[channel] = len(messages)

    async def open_rows(self) -> tuple[int, int]:
        """Inbox messages not yet answered, and outbox parts not yet sent."""
        assert self._pool is not None
        inbox = await self._pool.fetchval(
            "SELECT count(*) FROM inbox WHERE status IN ('pending', 'processing')"
        )
        outbox = await self._pool.fetchval(
            "SELECT count(*) FROM outbox WHERE status IN ('pending', 'sending')"
        )
        return int(inbox), int(outbox)

    async def settle(self, timeout: float) -> bool:
        """Until nothing is left to answer or send (True), or ``timeout`` seconds (False)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if await self.open_rows() == (0, 0):
                self.look()
                return True
            await asyncio.sleep(0.1)
        self.look()
        return False

    async def tally(self, scenario: str, messages: Iterable[Message], *, timeout: float) -> Tally:
        """Waits for the run to settle, then counts."""
        settled = await self.settle(timeout)
        result = tally(scenario, messages, self.delivered)
        if not settled:
            result.note = f"not settled within {timeout:g} s\n{await self.diagnose()}"
        elif not result.clean:
            result.note = await self.diagnose()
        return result

    async def diagnose(self) -> str:
        """Inbox and outbox by status with their last errors, and the processes' last words."""
        assert self._pool is not None
        lines = []
        for table in ("inbox", "outbox"):
            column = "error" if table == "inbox" else "error_message"
            rows = await self._pool.fetch(
                f"""SELECT status, count(*) AS n, max({column}) AS error
                      FROM {table} GROUP BY status ORDER BY status"""
            )
            lines += [f"{table} {r['status']}: {r['n']} ({r['error']})" for r in rows]
        for process in (self.gateway, self.worker):
            if process is not None:
                state = "running" if process.alive() else f"exited {process.popen.returncode}"
                lines.append(f"{process.name} ({state}):\n{process.tail()}")
        return "\n".join(lines)


# --- the scenarios -----------------------------------------------------------------------------


async def redis_outage(
    rig: Rig, *, rate: float, outage: float, margin: float, settle: float = 60.0
) -> Tally:
    """Webhooks at ``rate`` for ``margin + outage + margin`` seconds; Redis is killed
    (SIGKILL) after the first margin and comes back empty ``outage`` seconds later."""
    await rig.heal()

    async def outage_window() -> None:
        await asyncio.sleep(margin)
        await asyncio.to_thread(rig.redis.kill)
        await asyncio.sleep(outage)
        await asyncio.to_thread(rig.redis.start)

    fault = asyncio.create_task(outage_window())
    messages = await rig.load(rate, 2 * margin + outage)
    await fault
    return await rig.tally(
        f"Redis killed for {outage:g} s, back empty ({rate:g} webhooks/s)",
        messages,
        timeout=settle,
    )


async def widget_during_redis_outage(rig: Rig, *, chats: int) -> WidgetTally:
    """``chats`` widget chats, one after the other, each a new visitor, while Redis is down."""
    await rig.heal()
    await asyncio.to_thread(rig.redis.kill)
    answered, failures, seconds = 0, Counter[str](), []
    loop = asyncio.get_running_loop()
    try:
        for number in range(chats):
            ref = f"ref-{900_000 + number:06d}"
            started = loop.time()
            stream = await rig.widget(
                f"How long does delivery to Belgium take? My reference is {ref}.",
                f"widget-visitor-{number:04d}",
            )
            kinds = stream.kinds()
            if stream.status != 200:
                error = stream.events[0][1].get("error", {}) if stream.events else {}
                failures[f"HTTP {stream.status} {error.get('code', '')}".strip()] += 1
            elif "error" in kinds:
                failures[f"error event {stream.data('error').get('code')}"] += 1
            elif "done" not in kinds or ref not in stream.data("done").get("answer", ""):
                failures["no answer"] += 1
            else:
                answered += 1
                seconds.append(loop.time() - started)
    finally:
        await asyncio.to_thread(rig.redis.start)
    return WidgetTally("widget chat while Redis is down", chats, answered, failures, seconds)


ModelFailure = Literal["status 500", "hang", "refused"]


async def model_outage(
    rig: Rig,
    *,
    failure: ModelFailure,
    rate: float,
    load: float,
    outage: float,
    start: float = 0.0,
    settle: float = 120.0,
) -> Tally:
    """Webhooks at ``rate`` for ``load`` seconds; from ``start`` seconds in, for ``outage``
    seconds, the model answers HTTP 500, hangs (accepts the request, never answers) or is
    gone (connections refused). Then it answers again."""
    await rig.heal()
    model = rig.model

    async def outage_window() -> None:
        await asyncio.sleep(start)
        if failure == "status 500":
            model.chat_down_with = 500
        elif failure == "hang":
            model.hang = True
        else:
            await rig._fakes.model_gone()
        await asyncio.sleep(outage)
        model.chat_down_with = None
        model.hang = False
        await rig._fakes.model_up()

    fault = asyncio.create_task(outage_window())
    messages = await rig.load(rate, load)
    await fault
    described = {
        "status 500": "model answers HTTP 500",
        "hang": "model hangs",
        "refused": "model down (connection refused)",
    }[failure]
    return await rig.tally(
        f"{described} for {outage:g} s ({len(messages)} messages in {load:g} s)",
        messages,
        timeout=settle,
    )


async def provider_answers_late(
    rig: Rig, *, messages: int, late_by: float, rate: float = 1.0, settle: float = 120.0
) -> Tally:
    """WhatsApp messages whose replies Twilio accepts at once but answers ``late_by``
    seconds later: after Parley's send timeout (PARLEY_TWILIO_SEND_TIMEOUT_SECONDS)."""
    await rig.heal()
    rig.twilio.answer_late_by = late_by
    try:
        sent = await rig.load(rate, messages / rate, channels=("whatsapp",))
        result = await rig.tally(
            f"Twilio accepts, answers after {late_by:g} s ({len(sent)} messages)",
            sent,
            timeout=settle,
        )
    finally:
        rig.twilio.answer_late_by = 0.0
    return result


async def burst(
    rig: Rig, *, rate: float, seconds: float, model_seconds: float, settle: float = 300.0
) -> Tally:
    """Webhooks at ``rate`` for ``seconds`` with a model taking ``model_seconds`` to answer;
    nothing fails."""
    await rig.heal()
    rig.model.first_token_delay = model_seconds
    try:
        messages = await rig.load(rate, seconds)
        result = await rig.tally(
            f"{rate:g} webhooks/s for {seconds:g} s, {model_seconds:g} s model, no fault",
            messages,
            timeout=settle,
        )
    finally:
        rig.model.first_token_delay = 0.0
    return result


async def worker_killed(
    rig: Rig,
    *,
    rate: float,
    seconds: float,
    kills: int,
    model_seconds: float,
    wait_for_leases: bool,
    settle: float = 180.0,
) -> Tally:
    """WhatsApp webhooks at ``rate`` for ``seconds``, a model taking ``model_seconds``; the
    worker is killed (SIGKILL) ``kills`` times, each time while it is both answering a message
    and sending a reply, and restarted at once. So that a send is surely in flight, Twilio
    takes its time to answer sends (it has accepted them) from a moment before each kill.

    With ``wait_for_leases`` its claims come back when their leases run out (a minute);
    without, they are made to run out at once (`Rig.expire_leases`), to keep a test short.
    """
    await rig.heal()
    rig.model.first_token_delay = model_seconds
    held: list[tuple[int, int]] = []

    async def caught_in_the_act(slow_since: float) -> bool:
        """Answering a message, and sending a reply that Twilio has accepted in the last half
        second without answering yet (the send has not timed out)."""
        rig.look()
        recent = max(slow_since, asyncio.get_running_loop().time() - 0.5)
        if not any(at >= recent for channel, at in rig.arrivals if channel == "whatsapp"):
            return False
        inbox, outbox = await rig.held_rows()
        return inbox > 0 and outbox > 0

    async def killings() -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        for number in range(kills):
            # Spread over the load; then at the first moment it answers and sends.
            await asyncio.sleep(max(0.0, began + seconds * number / kills + 0.5 - loop.time()))
            while True:
                rig.twilio.answer_late_by = 60.0
                slow_since = loop.time()
                while not await caught_in_the_act(slow_since):
                    await asyncio.sleep(0.02)
                await rig.kill_worker()
                rig.twilio.answer_late_by = 0.0
                caught = await rig.held_rows()
                if not wait_for_leases:
                    await rig.expire_leases()
                await rig.start_worker()
                if all(caught):  # else a turn or a send ended just before the kill: again
                    held.append(caught)
                    break

    try:
        fault = asyncio.create_task(killings())
        messages = await rig.load(rate, seconds, channels=("whatsapp",))
        await fault
        result = await rig.tally(
            f"worker SIGKILLed {kills}x mid-turn and mid-send ({rate:g} webhooks/s for "
            f"{seconds:g} s)",
            messages,
            timeout=settle,
        )
    finally:
        rig.model.first_token_delay = 0.0
        rig.twilio.answer_late_by = 0.0
    result.facts["held by the killed worker (inbox, outbox)"] = held
    return result
