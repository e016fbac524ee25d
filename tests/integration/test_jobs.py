"""Scheduled jobs on real Postgres: once per slot across processes, the lock, and each job."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import time as clock
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import aiohttp
import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from core.cache import RedisCache
from core.errors import ConfigError, InvalidInput
from core.jobs.answer_checks import evaluate
from core.jobs.scheduler import (
    DailyAt,
    Every,
    Job,
    JobRunner,
    Skipped,
    job_schedules,
    parse_schedule,
)
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.settings import JOB_NAMES, Settings
from core.store import Agent, Agents, Database
from core.store.answer_checks import AnswerCheck, AnswerChecks
from core.store.conversations import Conversations, TurnRecord
from core.store.database import connect
from core.store.inbox import Inbox
from core.store.job_runs import INTERRUPTED, JobRun, JobRuns
from core.store.knowledge import KnowledgeStore
from core.store.outbox import Outbox, enqueue
from core.store.vector_index import EmbedderIdentity
from gateway.runtime import Runtime, open_answering
from gateway.scheduled import job_runner, open_jobs
from tests.conftest import MakeSettings
from tests.support.cli import PARLEY, clean_env, run_parley
from tests.support.deliveries import add_delivery
from tests.support.services import LOOPBACK, free_port

PAGES = [
    {"url": "/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days. Shipping costs 4.95 euro."},
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days for a full refund."},
    {"url": "/en/products/fjord", "title": "Fjord GTX boot", "lang": "en",
     "text": "# Fjord GTX boot\nThe Fjord GTX (NK-2041) is a waterproof leather hiking boot. "
             "Price: 189.95 euro. Colours: brown and blue."},
]  # fmt: skip
# Every job off but the one under test, which fires every second.
EVERY_SECOND = {name: "off" for name in JOB_NAMES} | {"answer-checks": "every 1s"}
SLOT_LINE = re.compile(r"jobs\.(ran|skipped) name=answer-checks slot=(\S+)")


async def _poll(
    condition: Callable[[], Awaitable[Any]], *, within: float = 60, what: str = "condition"
) -> Any:
    deadline = clock.monotonic() + within
    while clock.monotonic() < deadline:
        value = await condition()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} not reached within {within} s")


@pytest.fixture
async def shop(database: Database, use_embedder: UseEmbedder, tmp_path: Path) -> Agent:
    """Agent `shop` with three pages of knowledge, answered without an LLM."""
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    agent = await agents.update("shop", contact_route="hello@shop.example")
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    store = KnowledgeStore(database.pool)
    await Ingestor(store, use_embedder).ingest(agent, parse_source(str(path)))
    return await agents.get("shop")


@asynccontextmanager
async def open_test_jobs(
    settings: Settings, database: Database, cache: RedisCache, embedder: UseEmbedder
) -> AsyncIterator[tuple[dict[str, Job], JobRunner]]:
    """The production jobs and runner, on this test's database."""
    async with aiohttp.ClientSession() as http:
        runtime = Runtime(settings, database, cache, embedder, http, Agents(database.pool))
        async with open_answering(runtime) as answering, open_jobs(answering) as jobs:
            yield jobs, job_runner(runtime)


def _ran(outcome: JobRun | Skipped) -> JobRun:
    assert isinstance(outcome, JobRun), outcome
    assert outcome.status == "ok", outcome.error
    return outcome


# --- schedules -----------------------------------------------------------------------------


def test_interval_slots_are_the_same_in_every_process() -> None:
    every = Every(300)
    assert every.describe() == "every 5m"
    first = datetime(2026, 3, 1, 10, 4, 59, 900000, tzinfo=UTC)
    assert every.slot(first) == datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    # a process whose timer fired a few seconds later lands on the same slot
    assert every.slot(first + timedelta(seconds=3)) == datetime(2026, 3, 1, 10, 5, tzinfo=UTC)
    assert every.slot(datetime(2026, 3, 1, 10, 5, 2, tzinfo=UTC)) == every.slot(
        datetime(2026, 3, 1, 10, 5, 0, tzinfo=UTC)
    )
    assert every.next_after(first) == datetime(2026, 3, 1, 10, 5, tzinfo=UTC)


def test_daily_slots_follow_the_server_time_zone() -> None:
    zone = ZoneInfo("Europe/Amsterdam")
    nightly = DailyAt(time(3, 0), zone)
    just_after = datetime(2026, 7, 1, 1, 0, 4, tzinfo=UTC)  # 03:00:04 in Amsterdam (CEST)
    assert nightly.slot(just_after) == datetime(2026, 7, 1, 3, 0, tzinfo=zone)
    assert nightly.slot(just_after - timedelta(seconds=5)) == datetime(
        2026, 6, 30, 3, 0, tzinfo=zone
    )
    assert nightly.next_after(just_after) == datetime(2026, 7, 2, 3, 0, tzinfo=zone)
    assert DailyAt(time(23, 45), zone).later(30).at == time(0, 15)


def test_schedules_come_from_the_settings(make_settings: MakeSettings) -> None:
    settings = make_settings(
        nightly_at="04:15",
        jobs_timezone="Europe/Amsterdam",
        job_schedules={"summaries": "every 2m", "retention": "off"},
    )
    described = {
        name: schedule.describe() if schedule else "off"
        for name, schedule in job_schedules(settings).items()
    }
    assert described == {
        "summaries": "every 2m",
        "recrawl": "daily 04:15 Europe/Amsterdam",
        "answer-checks": "daily 05:15 Europe/Amsterdam",
        "retention": "off",
        "outbox-sweep": "every 5m",
    }
    with pytest.raises(ConfigError, match="expected 'every 5m'"):
        parse_schedule("hourly", UTC)


# --- once per slot, across processes ---------------------------------------------------------


@dataclass
class Worker:
    process: subprocess.Popen[str]
    log: Path

    @property
    def instance(self) -> str:
        return f"{socket.gethostname()}:{self.process.pid}"

    def slots(self) -> dict[str, str]:
        """What this worker did about each answer-checks slot it fired: ran or skipped."""
        return {m[2]: m[1] for m in SLOT_LINE.finditer(self.log.read_text())}


def _start_worker(tmp_path: Path, name: str, database_url: str) -> Worker:
    log = tmp_path / f"{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [PARLEY, "worker"],
            cwd=tmp_path,
            env=clean_env(
                PARLEY_DATABASE_URL=database_url,
                PARLEY_DATA_DIR=str(tmp_path / "data"),
                PARLEY_JOB_SCHEDULES=json.dumps(EVERY_SECOND),
                PARLEY_LOG_LEVEL="INFO",
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return Worker(process, log)


async def test_two_worker_processes_run_each_slot_once(
    database: Database, shop: Agent, database_url: str, tmp_path: Path
) -> None:
    checks = AnswerChecks(database.pool)
    await checks.create(shop.id, "How long does delivery to Belgium take?",
                        expected_facts=["2-3 working days"])  # fmt: skip
    await checks.create(shop.id, "What does the Fjord GTX boot cost?",
                        must_cite="/en/products/fjord")  # fmt: skip
    workers = [_start_worker(tmp_path, name, database_url) for name in ("one", "two")]
    try:

        async def finished_runs() -> bool:
            for worker in workers:
                assert worker.process.poll() is None, worker.log.read_text()
            done = await database.pool.fetchval(
                "SELECT count(*) FROM job_runs WHERE name = 'answer-checks' AND status = 'ok'"
            )
            return done >= 4 and len(_contested(workers)) >= 2

        await _poll(finished_runs, within=90, what="four runs, two of them contested")
    finally:
        for worker in workers:
            worker.process.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                await asyncio.to_thread(worker.process.wait, 30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                raise
    for worker in workers:
        assert worker.process.returncode == 0
        assert "Traceback" not in worker.log.read_text()

    runs = await database.pool.fetch(
        "SELECT * FROM job_runs WHERE name = 'answer-checks' ORDER BY slot"
    )
    assert all(r["trigger"] == "schedule" for r in runs)
    assert len({r["slot"] for r in runs}) == len(runs)  # never two runs for one slot
    # a run only ends unfinished when a worker was stopped in the middle of it
    assert all(r["status"] == "ok" or r["error"].startswith("cancelled") for r in runs)
    assert {r["instance"] for r in runs} <= {w.instance for w in workers}

    # The job's effect happened once per run: one result per check, never twice.
    counts = dict(
        await database.pool.fetch(
            "SELECT run_id, count(*) FROM answer_check_results GROUP BY run_id"
        )
    )
    for run in runs:
        if run["status"] == "ok":
            assert counts.get(run["id"]) == 2, (run["id"], counts)
    assert sum(counts.values()) <= 2 * len(runs)

    # Each slot ran in one process at most, and every run the processes report is recorded.
    ran = [{slot for slot, what in w.slots().items() if what == "ran"} for w in workers]
    assert not ran[0] & ran[1]
    recorded = {r["slot"].astimezone(UTC).isoformat(timespec="seconds"): r for r in runs}
    finished = {slot for slot, r in recorded.items() if r["status"] == "ok"}
    assert ran[0] | ran[1] <= finished
    # a run that finished as its worker was being stopped may not have been logged
    assert len(finished - ran[0] - ran[1]) <= len(workers)
    for worker, slots in zip(workers, ran, strict=True):
        assert all(recorded[slot]["instance"] == worker.instance for slot in slots)
    assert len(_contested(workers)) >= 2


def _contested(workers: list[Worker]) -> set[str]:
    """Slots both workers fired, that one of them ran."""
    one, two = (w.slots() for w in workers)
    return {slot for slot in one.keys() & two.keys() if "ran" in (one[slot], two[slot])}


async def test_a_slot_that_ran_is_not_run_again_by_a_later_process(
    settings: Settings, database: Database, cache: RedisCache, use_embedder: UseEmbedder
) -> None:
    async with open_test_jobs(settings, database, cache, use_embedder) as (jobs, first):
        second = JobRunner(database.pool, lambda: connect(database.url), instance="elsewhere:1")
        slot = datetime(2026, 1, 1, 3, 0, tzinfo=UTC)
        run = _ran(await first.run(jobs["outbox-sweep"], slot=slot))
        assert (run.trigger, run.slot, run.instance) == ("schedule", slot, first.instance)
        assert await second.run(jobs["outbox-sweep"], slot=slot) == Skipped("done")
        later = _ran(await second.run(jobs["outbox-sweep"], slot=slot + timedelta(minutes=5)))
        assert later.instance == "elsewhere:1"
        by_hand = _ran(await second.run(jobs["outbox-sweep"]))
        assert (by_hand.trigger, by_hand.slot) == ("manual", None)


# --- the lock --------------------------------------------------------------------------------


@dataclass
class Site:
    """A small website with ETags; a page can be held back until the test lets it go."""

    pages: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # path: (html, etag)
    log: list[tuple[str, str | None, int]] = field(default_factory=list)  # path, validator, status
    held: set[str] = field(default_factory=set)
    waiting: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    origin: str = ""

    def page(self, path: str, text: str, etag: str | None = None) -> None:
        html = (
            f"<!doctype html><html lang='en'><head><title>{path}</title></head><body><main>"
            f"<article><h1>{path}</h1><p>{text}</p><p>All our stores are open from Monday "
            "to Saturday and our team answers every question within one working day.</p>"
            "</article></main></body></html>"
        )
        self.pages[path] = (html, etag)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/sitemap.xml":
            urls = "".join(f"<url><loc>{self.origin}{p}</loc></url>" for p in self.pages)
            body = f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>'
            return web.Response(text=body, content_type="application/xml")
        if request.path not in self.pages:
            raise web.HTTPNotFound()
        if request.path in self.held:
            self.waiting += 1
            await self.gate.wait()
        html, etag = self.pages[request.path]
        validator = request.headers.get("If-None-Match")
        if etag is not None and validator == etag:
            self.log.append((request.path, validator, 304))
            return web.Response(status=304, headers={"ETag": etag})
        self.log.append((request.path, validator, 200))
        headers = {"ETag": etag} if etag else {}
        return web.Response(text=html, content_type="text/html", headers=headers)


@pytest.fixture
async def site(aiohttp_server: AiohttpServer) -> Site:
    site = Site()
    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", site.handle)
    server = await aiohttp_server(app)
    site.origin = str(server.make_url("")).rstrip("/")
    site.page("/a", "Parcels to the Netherlands arrive the next working day.", '"a1"')
    site.page("/b", "Gift cards are valid for two years after purchase.", '"b1"')
    site.page("/c", "Our warehouse is in Utrecht and ships six days a week.")  # no ETag
    return site


async def _chunks(database: Database, agent: Agent) -> dict[str, list[tuple[int, str]]]:
    rows = await database.pool.fetch(
        """SELECT p.url, c.id, c.text FROM chunks c JOIN pages p ON p.id = c.page_id
            WHERE c.agent_id = $1 ORDER BY c.id""",
        agent.id,
    )
    found: dict[str, list[tuple[int, str]]] = {}
    for row in rows:
        found.setdefault(urlsplit(row["url"]).path, []).append((row["id"], row["text"]))
    return found


async def test_recrawl_re_embeds_only_the_changed_page(
    settings: Settings,
    database: Database,
    cache: RedisCache,
    use_embedder: UseEmbedder,
    shop: Agent,
    site: Site,
) -> None:
    store = KnowledgeStore(database.pool)
    first = await Ingestor(store, use_embedder, allow_networks=LOOPBACK).ingest(
        shop, parse_source(f"{site.origin}/sitemap.xml")
    )
    assert first.added == 3
    down = await store.upsert_source(shop.id, "url", f"http://127.0.0.1:{free_port()}/")
    before = await _chunks(database, shop)
    site.page("/b", "Gift cards are now valid for three years after purchase.", '"b2"')
    site.log.clear()

    async with open_test_jobs(settings, database, cache, use_embedder) as (jobs, runner):
        run = _ran(await runner.run(jobs["recrawl"]))

    after = await _chunks(database, shop)
    assert after["/a"] == before["/a"]  # same rows: not embedded again
    assert after["/c"] == before["/c"]
    assert {i for i, _ in after["/b"]}.isdisjoint(i for i, _ in before["/b"])
    assert any("three years" in text for _, text in after["/b"])
    assert ("/a", '"a1"', 304) in site.log  # asked conditionally, answered "not modified"
    assert ("/b", '"b1"', 200) in site.log
    assert ("/c", None, 200) in site.log  # no validator: fetched, found unchanged by its hash
    details = run.details
    assert (details["added"], details["updated"], details["unchanged"]) == (0, 1, 2)
    assert details["chunks_embedded"] == len(after["/b"])
    assert details["failed"] == 1
    failed = [s for s in details["sources"] if "failed" in s]
    assert [s["source_id"] for s in failed] == [down]
    assert "1 updated, 2 unchanged" in (run.summary or "")
    sources = {s.id: s for s in await store.list_sources(shop.id)}
    assert sources[down].status == "failed"
    assert sources[first.source_id].status == "ready"
    # the local knowledge base is not a crawl source and was left alone
    assert (await store.stored_pages(shop.id)).keys() >= {"/en/shipping", "/en/returns"}


async def test_a_running_job_holds_its_lock_across_processes(
    settings: Settings,
    database: Database,
    cache: RedisCache,
    use_embedder: UseEmbedder,
    shop: Agent,
    site: Site,
    database_url: str,
    tmp_path: Path,
) -> None:
    await Ingestor(KnowledgeStore(database.pool), use_embedder, allow_networks=LOOPBACK).ingest(
        shop, parse_source(f"{site.origin}/sitemap.xml")
    )
    site.held.add("/b")
    env = {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_DATA_DIR": str(tmp_path / "data"),
        "PARLEY_CRAWL_ALLOW_NETWORKS": ",".join(map(str, LOOPBACK)),
    }
    holder = subprocess.Popen(
        [PARLEY, "jobs", "run", "recrawl"],
        cwd=tmp_path,
        env=clean_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        async def holding() -> bool:
            assert holder.poll() is None, holder.communicate()
            return site.waiting > 0

        await _poll(holding, what="the other process crawling")
        instance = f"{socket.gethostname()}:{holder.pid}"
        async with open_test_jobs(settings, database, cache, use_embedder) as (jobs, runner):
            busy = await runner.run(jobs["recrawl"])
            assert isinstance(busy, Skipped)
            assert busy.reason == "busy"
            assert busy.holder is not None
            assert busy.holder.instance == instance

            refused = await asyncio.to_thread(
                run_parley, "jobs", "run", "recrawl", cwd=tmp_path, **env
            )
            assert refused.returncode == 2
            [line] = refused.stderr.strip().splitlines()
            assert line.startswith(f"parley: error: job recrawl is running already on {instance}")

            holder.kill()  # dies mid-run: the database drops its lock with its connection
            await asyncio.to_thread(holder.communicate, timeout=30)
            site.held.clear()
            site.gate.set()

            async def runs_now() -> JobRun | None:
                outcome = await runner.run(jobs["recrawl"])
                return outcome if isinstance(outcome, JobRun) else None

            run = await _poll(runs_now, within=30, what="the lock released")
            assert run.status == "ok", run.error
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
    [dead] = [r for r in await JobRuns(database.pool).recent("recrawl") if r.instance == instance]
    assert dead.status == "failed"
    assert dead.error == INTERRUPTED


# --- answer checks ---------------------------------------------------------------------------


def _check(facts: tuple[str, ...] = (), cite: str | None = None) -> AnswerCheck:
    return AnswerCheck(1, 1, "q", facts, cite, None, datetime.now(UTC))


def test_a_check_needs_every_fact_and_the_cited_page() -> None:
    answer = "Orders to Belgium arrive in 2-3  Working Days [1]."
    assert evaluate(_check(("2-3 working days",)), answer, []).passed
    missed = evaluate(_check(("2-3 working days", "bpost")), answer, [])
    assert not missed.passed
    assert missed.missing_facts == ("bpost",)
    cited = evaluate(_check(cite="https://Shop.example/en/shipping/"), answer,
                     ["https://shop.example/en/shipping#costs"])  # fmt: skip
    assert cited.passed
    assert cited.cited_ok is True
    assert not evaluate(_check(cite="/en/faq"), answer, ["/en/shipping"]).passed


async def test_answer_checks_run_through_the_pipeline_and_keep_results(
    settings: Settings,
    database: Database,
    cache: RedisCache,
    use_embedder: UseEmbedder,
    shop: Agent,
) -> None:
    checks = AnswerChecks(database.pool)
    belgium = "How long does delivery to Belgium take?"
    good = await checks.create(shop.id, belgium, expected_facts=["2-3 working days"])
    wrong_fact = await checks.create(shop.id, belgium, expected_facts=["next day"])
    cites = await checks.create(
        shop.id, "What is the Fjord GTX boot made of?", expected_facts=["Waterproof Leather"],
        must_cite="/en/products/fjord",
    )  # fmt: skip
    wrong_page = await checks.create(
        shop.id, "What does the Fjord GTX boot cost?", must_cite="/en/returns"
    )
    assert [c.id for c in await checks.list(shop.id)] == [
        good.id, wrong_fact.id, cites.id, wrong_page.id
    ]  # fmt: skip

    async with open_test_jobs(settings, database, cache, use_embedder) as (jobs, runner):
        run = _ran(await runner.run(jobs["answer-checks"]))
    results = {r.check_id: r for r in await checks.results(shop.id, run_id=run.id)}
    assert run.summary == "4 checks of 1 agents: 2 passed, 2 failed"
    assert results[good.id].passed
    assert "2-3 working days" in results[good.id].answer
    assert not results[wrong_fact.id].passed
    assert results[wrong_fact.id].missing_facts == ("next day",)
    assert results[cites.id].passed
    assert results[cites.id].cited_ok is True
    assert "/en/products/fjord" in results[cites.id].cited_urls
    assert not results[wrong_page.id].passed
    assert results[wrong_page.id].cited_ok is False
    assert results[wrong_page.id].question == "What does the Fjord GTX boot cost?"
    # each question was a turn of its own on the test channel, there for staff to inspect
    turn = results[good.id].turn_id
    assert turn is not None
    assert await database.pool.fetchval("SELECT channel FROM turns WHERE id = $1", turn) == "test"
    # ...but rehearsals: they are no customer's usage, and the weak ones are no content gaps
    assert await database.pool.fetchval("SELECT count(*) FROM usage") == 0
    assert await database.pool.fetchval("SELECT count(*) FROM content_gaps") == 0

    await checks.delete(shop.id, wrong_fact.id)
    latest = await checks.latest_results(shop.id)
    assert [r.check_id for r in latest] == [good.id, cites.id, wrong_page.id]
    with pytest.raises(InvalidInput, match="needs an expected fact or a URL to cite"):
        await checks.create(shop.id, "Anything?")


# --- retention and the outbox sweep ----------------------------------------------------------


async def _conversation(database: Database, agent: Agent, key: str, days_old: int) -> int:
    saved = await Conversations(database.pool).save_turn(
        TurnRecord(
            agent_id=agent.id, channel="whatsapp", conversation_key=key, question="Where is it?",
            answer="On its way.", save_question=True, rewritten_query=None, confidence=0.8,
            low_confidence=False, mode="extractive", trace={}, language="en",
        )
    )  # fmt: skip
    age = timedelta(days=days_old)
    await database.pool.execute(
        "UPDATE conversations SET last_message_at = now() - $2::interval WHERE id = $1",
        saved.conversation_id,
        age,
    )
    await database.pool.execute(
        "UPDATE messages SET created_at = now() - $2::interval WHERE conversation_id = $1",
        saved.conversation_id,
        age,
    )
    await database.pool.execute(
        """INSERT INTO summaries (conversation_id, text, through_message, generation)
           VALUES ($1, 'Wants to know where the order is.', 0, 0)""",
        saved.conversation_id,
    )
    return saved.conversation_id


async def _count(database: Database, table: str, conversation_id: int) -> int:
    column = "id" if table == "conversations" else "conversation_id"
    value = await database.pool.fetchval(
        f"SELECT count(*) FROM {table} WHERE {column} = $1", conversation_id
    )
    return int(value)


async def test_retention_deletes_only_what_is_old(
    make_settings: MakeSettings,
    database: Database,
    cache: RedisCache,
    use_embedder: UseEmbedder,
    shop: Agent,
) -> None:
    pool = database.pool
    old = await _conversation(database, shop, "whatsapp:+31600000001", 120)
    recent = await _conversation(database, shop, "whatsapp:+31600000002", 10)
    # staff wrote in it last week, even if the conversation's own time says otherwise
    revived = await _conversation(database, shop, "whatsapp:+31600000003", 120)
    await pool.execute(
        "INSERT INTO messages (conversation_id, role, text) VALUES ($1, 'staff', 'Update?')",
        revived,
    )

    inbox = Inbox(pool)
    for number, (status, days) in enumerate(
        [("done", 100), ("failed", 100), ("pending", 100), ("done", 5)]
    ):
        await add_delivery(inbox, shop.id, "whatsapp", f"SM{number}", "whatsapp:+31600000001", {})
        await pool.execute(
            """UPDATE inbox SET status = $2, received_at = now() - $3::interval,
                                processed_at = now() - $3::interval
                WHERE provider_message_id = $1""",
            f"SM{number}",
            status,
            timedelta(days=days),
        )
    async with pool.acquire() as conn:
        ids = await enqueue(conn, agent_id=shop.id, channel="telegram", recipient="42",
                            parts=["a", "b", "c", "d"])  # fmt: skip
    for row_id, (status, days) in zip(
        ids, [("sent", 100), ("failed", 100), ("pending", 100), ("delivered", 5)], strict=True
    ):
        await pool.execute(
            """UPDATE outbox SET status = $2, created_at = now() - $3::interval,
                                 sent_at = CASE WHEN $2 = 'sent' THEN now() - $3::interval END
                WHERE id = $1""",
            row_id,
            status,
            timedelta(days=days),
        )

    runs = JobRuns(pool)
    for _ in range(2):
        earlier = await runs.start("recrawl", trigger="manual", slot=None, instance="elsewhere")
        assert earlier is not None
        await runs.finish(earlier.id, "done", {})
    await pool.execute(
        "UPDATE job_runs SET started_at = now() - interval '200 days' WHERE name = 'recrawl'"
    )
    latest_recrawl = earlier.id

    settings = make_settings(retention_days=90)
    async with open_test_jobs(settings, database, cache, use_embedder) as (jobs, runner):
        run = _ran(await runner.run(jobs["retention"]))
    assert run.details == {
        "days": 90, "conversations": 1, "inbox": 2, "outbox": 2, "job_runs": 1
    }  # fmt: skip
    for table in ("conversations", "messages", "turns", "summaries"):
        assert await _count(database, table, old) == 0, table
        assert await _count(database, table, recent) > 0, table
    assert await _count(database, "conversations", revived) == 1
    left = await pool.fetch("SELECT provider_message_id, status FROM inbox ORDER BY id")
    assert [tuple(r) for r in left] == [("SM2", "pending"), ("SM3", "done")]
    assert [r.status for r in await Outbox(pool).rows(shop.id)] == ["pending", "delivered"]
    assert [r.id for r in await runs.recent("recrawl")] == [latest_recrawl]

    again = await _conversation(database, shop, "whatsapp:+31600000004", 400)
    off = make_settings(retention_days=0)
    async with open_test_jobs(off, database, cache, use_embedder) as (jobs, runner):
        kept = _ran(await runner.run(jobs["retention"]))
    assert "retention is off" in (kept.summary or "")
    assert await _count(database, "conversations", again) == 1


async def test_outbox_sweep_requeues_stuck_sends_and_gives_up_on_old_ones(
    settings: Settings,
    database: Database,
    cache: RedisCache,
    use_embedder: UseEmbedder,
    shop: Agent,
) -> None:
    pool = database.pool
    cases = {
        # recipient: (status, lease from now, queued ago, last error) -> expected status
        "stuck": ("sending", -60, timedelta(minutes=5), None),
        "busy": ("sending", 60, timedelta(minutes=5), None),
        "stale": ("pending", None, timedelta(days=2), None),
        "stale-stuck": ("sending", -60, timedelta(days=2), "HTTP 500 from Telegram"),
        "waiting": ("pending", None, timedelta(minutes=5), None),
        "done": ("sent", None, timedelta(days=2), None),
    }
    for recipient, (status, lease, age, error) in cases.items():
        async with pool.acquire() as conn:
            [row_id] = await enqueue(conn, agent_id=shop.id, channel="telegram",
                                     recipient=recipient, parts=["hello"])  # fmt: skip
        await pool.execute(
            """UPDATE outbox SET status = $2, created_at = now() - $3::interval,
                                 lease_until = now() + make_interval(secs => $4),
                                 error_message = $5
                WHERE id = $1""",
            row_id,
            status,
            age,
            lease,
            error,
        )

    async with open_test_jobs(settings, database, cache, use_embedder) as (jobs, runner):
        run = _ran(await runner.run(jobs["outbox-sweep"]))
    assert run.details == {"released": 1, "expired": 2}
    rows = {r.recipient: r for r in await Outbox(pool).rows(shop.id)}
    assert {k: r.status for k, r in rows.items()} == {
        "stuck": "pending", "busy": "sending", "stale": "failed", "stale-stuck": "failed",
        "waiting": "pending", "done": "sent",
    }  # fmt: skip
    assert rows["stale"].error_code == "expired"
    assert rows["stale"].error_message == "not sent within 24 hours of being queued; given up"
    assert rows["stale-stuck"].error_message is not None
    assert rows["stale-stuck"].error_message.endswith("(last error: HTTP 500 from Telegram)")
    # the requeued row is due at once; the sender claims it on its next round
    claimed = await Outbox(pool).claim(10, 60)
    assert {r.recipient for r in claimed} == {"stuck", "waiting"}


async def test_summaries_catch_up_on_conversations_left_behind(
    settings: Settings,
    database: Database,
    cache: RedisCache,
    use_embedder: UseEmbedder,
    shop: Agent,
) -> None:
    conversations = Conversations(database.pool)
    for number in range(10):  # twenty messages, no summary: a process stopped before writing it
        saved = await conversations.save_turn(
            TurnRecord(
                agent_id=shop.id, channel="telegram", conversation_key="42",
                question=f"Question {number} about my order of Fjord boots?",
                answer=f"Answer {number}: it ships tomorrow.", save_question=True,
                rewritten_query=None, confidence=0.8, low_confidence=False, mode="extractive",
                trace={}, language="en",
            )
        )  # fmt: skip
    async with open_test_jobs(settings, database, cache, use_embedder) as (jobs, runner):
        run = _ran(await runner.run(jobs["summaries"]))
        assert run.details == {"written": 1}
        again = _ran(await runner.run(jobs["summaries"]))
        assert again.details == {"written": 0}  # up to date now
    summary = await database.pool.fetchval(
        "SELECT text FROM summaries WHERE conversation_id = $1", saved.conversation_id
    )
    assert summary


# --- the command line ------------------------------------------------------------------------


def test_jobs_list_and_run_on_the_command_line(tmp_path: Path, database_url: str) -> None:
    env = {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_DATA_DIR": str(tmp_path / "data"),
        "PARLEY_JOBS_TIMEZONE": "Europe/Amsterdam",
        "PARLEY_NIGHTLY_AT": "02:30",
    }
    listed = run_parley("jobs", "list", "--json", cwd=tmp_path, **env)
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in map(json.loads, listed.stdout.splitlines())}
    assert list(rows) == list(JOB_NAMES)
    assert rows["recrawl"]["schedule"] == "daily 02:30 Europe/Amsterdam"
    next_crawl = datetime.fromisoformat(rows["recrawl"]["next_run"])
    assert (next_crawl.hour, next_crawl.minute) == (2, 30)
    assert timedelta(0) < next_crawl - datetime.now(UTC) <= timedelta(days=1)
    assert rows["outbox-sweep"]["last_status"] is None

    ran = run_parley("jobs", "run", "outbox-sweep", cwd=tmp_path, **env)
    assert ran.returncode == 0, ran.stderr
    assert (
        ran.stdout
        == "outbox-sweep: 0 stuck sends put back in the queue, 0 unsent replies given up\n"
    )
    table = run_parley("jobs", "list", cwd=tmp_path, **env).stdout.splitlines()
    assert table[0].split() == ["NAME", "SCHEDULE", "NEXT", "RUN", "LAST", "RUN"]
    [sweep] = [line for line in table if line.startswith("outbox-sweep ")]
    assert "every 5m" in sweep
    assert " ok 20" in sweep
    [summaries] = [line for line in table if line.startswith("summaries ")]
    assert summaries.endswith("never")

    unknown = run_parley("jobs", "run", "backup", cwd=tmp_path, **env)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        "parley: error: unknown job 'backup'; the jobs are " + ", ".join(JOB_NAMES)
    ]
    bad = run_parley("jobs", "list", cwd=tmp_path, PARLEY_JOB_SCHEDULES='{"recrawl": "hourly"}',
                     **env)  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.startswith("parley: error: invalid setting PARLEY_JOB_SCHEDULES:")
    off = run_parley("jobs", "list", "--json", cwd=tmp_path, PARLEY_JOBS="off", **env)
    assert all(json.loads(line)["next_run"] is None for line in off.stdout.splitlines())
