"""Reports over a seeded history: exact figures per day and channel from the API, and the page."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from channels.registry import BY_NAME, secret_fields
from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from core.store.inbox_work import InboxWork
from core.store.staff import StaffAccounts
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.support.console import PASSWORD, STAFF_EMAIL, TOKEN, sign_in

Client = TestClient[web.Request, web.Application]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PERIOD = "agent=shop&from=2026-03-02&to=2026-03-04"


def at(moment: str) -> datetime:
    return datetime.fromisoformat(moment.replace("Z", "+00:00"))


class History:
    """Conversations written straight into the tables, each row at a chosen moment."""

    def __init__(self, pool: asyncpg.Pool, agent_id: int) -> None:
        self.pool, self.agent_id = pool, agent_id

    async def conversation(self, channel: str, key: str) -> int:
        found: int = await self.pool.fetchval(
            """INSERT INTO conversations (agent_id, channel, conversation_key) VALUES ($1, $2, $3)
               RETURNING id""",
            self.agent_id,
            channel,
            key,
        )
        return found

    async def message(self, conversation: int, role: str, text: str, moment: str,
                      turn: int | None = None) -> None:  # fmt: skip
        await self.pool.execute(
            """INSERT INTO messages (conversation_id, role, text, turn_id, created_at)
               VALUES ($1, $2, $3, $4, $5)""",
            conversation,
            role,
            text,
            turn,
            at(moment),
        )

    async def turn(self, conversation: int, question: str, moment: str, mode: str = "llm",
                   first_token: float | None = None, answer: str | None = "An answer.") -> int:  # fmt: skip
        channel = await self.pool.fetchval(
            "SELECT channel FROM conversations WHERE id = $1", conversation
        )
        timings: dict[str, float] = {"retrieve": 12.0, "total": 2000.0}
        if first_token is not None:
            timings["first_token"] = first_token
        turn: int = await self.pool.fetchval(
            """INSERT INTO turns (conversation_id, agent_id, channel, query, mode, trace, created_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id""",
            conversation,
            self.agent_id,
            channel,
            question,
            mode,
            {"timings_ms": timings},
            at(moment),
        )
        await self.message(conversation, "visitor", question, moment, turn)
        if answer is not None:
            await self.message(conversation, "assistant", answer, moment.replace("Z", ".5Z"), turn)
        return turn

    async def resolve(self, conversation: int, staff: str, moment: str) -> None:
        """Resolved as staff resolve it (the store's own set_status), then dated back."""
        last = await self.pool.fetchval("SELECT coalesce(max(id), 0) FROM conversation_resolutions")
        await InboxWork(self.pool).set_status(conversation, "resolved", staff)
        moved = await self.pool.execute(
            """UPDATE conversation_resolutions SET resolved_at = $3
                WHERE conversation_id = $1 AND id > $2""",
            conversation,
            last,
            at(moment),
        )
        assert moved == "UPDATE 1", f"resolving {conversation} recorded nothing"

    async def feedback(self, turn: int, rating: str, moment: str) -> None:
        await self.pool.execute(
            """INSERT INTO feedback (agent_id, conversation_id, turn_id, channel, rating, created_at)
               SELECT agent_id, conversation_id, id, channel, $2, $3 FROM turns WHERE id = $1""",
            turn,
            rating,
            at(moment),
        )


async def seed_history(pool: asyncpg.Pool, agent_id: int) -> None:
    h = History(pool, agent_id)
    # WhatsApp, 2 March (Amsterdam): two questions answered by the model.
    a = await h.conversation("whatsapp", "whatsapp:+31600000001")
    t1 = await h.turn(a, "What does shipping cost?", "2026-03-02T09:00:00Z", first_token=200)
    t2 = await h.turn(a, "And to Belgium?", "2026-03-02T09:05:00Z", first_token=400)
    await h.feedback(t1, "up", "2026-03-02T09:01:00Z")
    await h.feedback(t2, "down", "2026-03-02T09:06:00Z")
    # Telegram: asks for a person at 00:30 on 3 March in Amsterdam (still 2 March in UTC);
    # staff answer ten minutes later and hand back in the morning: not resolved.
    b = await h.conversation("telegram", "777000111")
    await h.turn(b, "I want to talk to a human", "2026-03-02T23:30:00Z", mode="handoff")
    await h.message(b, "system", "waiting_for_staff", "2026-03-02T23:30:01Z")
    await h.message(b, "system", "staff", "2026-03-02T23:39:59Z")
    await h.message(b, "staff", "Hi, Sam here.", "2026-03-02T23:40:00Z")
    await h.message(b, "system", "bot", "2026-03-03T10:00:00Z")
    # Website: one question on 3 March, resolved; the customer writes again on 4 March (which
    # reopens it), the answer comes without a model, and it is resolved again that day.
    c = await h.conversation("web", "web-session-1")
    t4 = await h.turn(c, "Do you repair bicycles?", "2026-03-03T12:00:00Z", first_token=1000)
    await h.feedback(t4, "up", "2026-03-03T12:01:00Z")
    await h.resolve(c, "ada@shop.example", "2026-03-03T12:30:00Z")
    await h.turn(c, "Opening hours?", "2026-03-04T08:00:00Z", mode="extractive")
    await h.resolve(c, "sam@shop.example", "2026-03-04T08:10:00Z")
    # Website, 4 March: answered, taken over, a message held for staff, staff reply 3 min on
    # and resolve it.
    f = await h.conversation("web", "web-session-2")
    await h.turn(f, "Where is my order?", "2026-03-04T09:00:00Z", first_token=600)
    await h.message(f, "system", "staff", "2026-03-04T09:01:00Z")
    await h.turn(f, "Order 1234", "2026-03-04T09:02:00Z", mode="staff", answer=None)
    await h.message(f, "staff", "It ships today.", "2026-03-04T09:05:00Z")
    await h.resolve(f, "sam@shop.example", "2026-03-04T09:06:00Z")
    # Not counted: a playground chat in the period, and a customer after it (resolved then).
    p = await h.conversation("playground", "playground-1")
    await h.turn(p, "Test question", "2026-03-03T12:00:00Z", first_token=5)
    await h.resolve(p, "ada@shop.example", "2026-03-03T12:05:00Z")
    late = await h.conversation("whatsapp", "whatsapp:+31600000002")
    await h.turn(late, "Late question", "2026-03-10T12:00:00Z", first_token=9000)
    await h.resolve(late, "ada@shop.example", "2026-03-10T12:05:00Z")
    # Content gaps: one asked in the period, one long before it.
    await pool.execute(
        """INSERT INTO content_gaps (agent_id, question, reason, created_at)
           VALUES ($1, 'Do you repair bicycles?', 'weak_match', $2),
                  ($1, 'Do you sell kayaks?', 'weak_match', $3)""",
        agent_id,
        at("2026-03-03T12:00:00Z"),
        at("2026-01-05T12:00:00Z"),
    )


@dataclass
class Reporting:
    client: Client
    pool: asyncpg.Pool


@pytest.fixture
async def reporting(
    make_settings: MakeSettings,
    settings: Settings,
    database: Database,
    use_embedder: UseEmbedder,
) -> AsyncIterator[Reporting]:
    pool = database.pool
    agents = Agents(pool, keyring=Keyring.from_settings(settings), secret_fields=secret_fields())
    identity = EmbedderIdentity.of(use_embedder)
    shop = await agents.create(
        "shop", embedder=identity, name="Noordkaap Shop", timezone="Europe/Amsterdam"
    )
    await seed_history(pool, shop.id)
    client: Client = TestClient(TestServer(create_app(make_settings(admin_token=TOKEN))))
    await client.start_server()
    yield Reporting(client, pool)
    await client.close()


def _row(figures: dict[str, Any]) -> dict[str, Any]:
    keys = ("conversations", "questions", "deflected", "handed_to_staff", "resolved",
            "thumbs_up", "thumbs_down", "thumbs_up_rate", "first_token_ms_median",
            "first_token_ms_p90", "staff_first_response_s_median")  # fmt: skip
    return {k: figures[k] for k in keys}


def _figures(conversations: int, questions: int, deflected: int, handed: int, resolved: int,
             up: int, down: int, rate: float | None, ttft: float | None, p90: float | None,
             staff: float | None) -> dict[str, Any]:  # fmt: skip
    return {"conversations": conversations, "questions": questions, "deflected": deflected,
            "handed_to_staff": handed, "resolved": resolved, "thumbs_up": up, "thumbs_down": down,
            "thumbs_up_rate": rate, "first_token_ms_median": ttft, "first_token_ms_p90": p90,
            "staff_first_response_s_median": staff}  # fmt: skip


async def test_report_figures_per_day_and_channel(reporting: Reporting) -> None:
    client = reporting.client
    response = await client.get(f"/api/v1/admin/reports?{PERIOD}", headers=AUTH)
    report = await response.json()
    assert response.status == 200, report
    assert (report["first_day"], report["last_day"]) == ("2026-03-02", "2026-03-04")
    assert report["timezone"] == "Europe/Amsterdam"
    assert report["feedback_recorded"] is True
    assert "resolved_by" not in report
    assert report["channels"] == [
        {"name": "whatsapp", "title": BY_NAME["whatsapp"].title},
        {"name": "telegram", "title": "Telegram"},
        {"name": "web", "title": "Website"},
    ]
    days = {(d["day"], d["channel"]): _row(d) for d in report["days"]}
    assert days == {
        ("2026-03-02", "whatsapp"): _figures(1, 2, 1, 0, 0, 1, 1, 0.5, 300, 380, None),
        # 00:30 in Amsterdam is 3 March there, though still 2 March in UTC
        # handed back to the bot, never resolved: not counted as resolved
        ("2026-03-03", "telegram"): _figures(1, 1, 0, 1, 0, 0, 0, None, None, None, 600),
        ("2026-03-03", "web"): _figures(1, 1, 1, 0, 1, 1, 0, 1.0, 1000, 1000, None),
        # resolved again: counted on this day too
        ("2026-03-04", "web"): _figures(2, 2, 1, 1, 2, 0, 0, None, 600, 600, 180),
    }
    per_channel = {c["channel"]: _row(c) for c in report["per_channel"]}
    assert per_channel["web"] == _figures(2, 3, 1, 1, 2, 1, 0, 1.0, 800, 960, 180)
    assert per_channel["telegram"]["resolved"] == 0
    total = _row(report["total"])
    assert total == {**_figures(4, 6, 2, 2, 2, 2, 1, total["thumbs_up_rate"], 500, 880, 390)}
    assert total["thumbs_up_rate"] == pytest.approx(2 / 3)
    assert [g["question"] for g in report["gaps"]] == ["Do you repair bicycles?"]

    # The page shows the same figures, in the agent's time zone, with a chart and a table each.
    await sign_in(client, token=TOKEN)
    page = await client.get(f"/admin/reports?{PERIOD}")
    html = await page.text()
    assert page.status == 200, html
    assert "Europe/Amsterdam" in html
    assert '<a href="/admin/reports" aria-current="page">Reports</a>' in html
    assert html.count('<svg viewBox="0 0 420 200"') == 11
    assert "<title>3 Mar · Telegram: 10.0 min</title>" in html  # staff's first response
    assert "<title>2 Mar · " + BY_NAME["whatsapp"].title + ": 300 ms</title>" in html
    summary = html.split('class="report-summary"')[1].split("</table>")[0]
    assert '<th scope="row">Conversations</th><td class="num">1</td><td class="num">1</td>' \
        '<td class="num">2</td><td class="num">4</td>' in summary  # fmt: skip
    assert '<th scope="row">Thumbs up rate</th><td class="num">50%</td><td class="num">–</td>' \
        '<td class="num">100%</td><td class="num">67%</td>' in summary  # fmt: skip
    assert '<th scope="row">Resolved</th><td class="num">0</td><td class="num">0</td>' \
        '<td class="num">2</td><td class="num">2</td>' in summary  # fmt: skip
    assert '<th scope="row">Answer cache hit rate</th><td class="num">0%</td>' \
        '<td class="num">–</td><td class="num">0%</td><td class="num">0%</td>' in summary  # fmt: skip
    assert "handed back" not in html
    assert "Do you repair bicycles?" in html
    assert "Do you sell kayaks?" not in html

    # A period the wrong way round is refused, by the API and on the page.
    wrong = await client.get("/api/v1/admin/reports?agent=shop&from=2026-03-04&to=2026-03-02",
                             headers=AUTH)  # fmt: skip
    assert wrong.status == 400
    assert "from is after to" in (await wrong.json())["error"]["message"]

    # Answers given again from the answer cache, as a share of the bot's answers: the late
    # WhatsApp question's answer, then the same asked by another customer (small talk and
    # quota messages are no answers).
    shop = await reporting.pool.fetchval("SELECT id FROM agents WHERE slug = 'shop'")
    history = History(reporting.pool, shop)
    other = await history.conversation("whatsapp", "whatsapp:+31600000003")
    await history.turn(other, "Late question", "2026-03-10T13:00:00Z", mode="cached")
    await history.turn(other, "Thanks!", "2026-03-10T13:01:00Z", mode="smalltalk")
    await history.turn(other, "Another one", "2026-03-10T13:02:00Z", mode="quota")
    later = "agent=shop&from=2026-03-10&to=2026-03-10"
    report = await (await client.get(f"/api/v1/admin/reports?{later}", headers=AUTH)).json()
    assert (report["total"]["cached"], report["total"]["cache_hit_rate"]) == (1, 0.5)
    html = await (await client.get(f"/admin/reports?{later}")).text()
    summary = html.split('class="report-summary"')[1].split("</table>")[0]
    assert '<th scope="row">Answered from the answer cache</th><td class="num">1</td>' in summary
    assert '<th scope="row">Answer cache hit rate</th><td class="num">50%</td>' in summary


async def test_agents_see_reports_and_no_feedback_yet(reporting: Reporting) -> None:
    await StaffAccounts(reporting.pool).create(STAFF_EMAIL, PASSWORD, role="agent")
    await reporting.pool.execute("DROP TABLE feedback CASCADE")  # as before migration 0013
    client = reporting.client
    assert (await sign_in(client, email=STAFF_EMAIL, password=PASSWORD)).status == 303
    conversations = await (await client.get("/admin/conversations")).text()
    assert '<a href="/admin/reports">Reports</a>' in conversations
    page = await client.get(f"/admin/reports?{PERIOD}")
    html = await page.text()
    assert page.status == 200, html
    assert "no feedback yet" in html
    assert "Thumbs up rate" not in html
    assert html.count('<svg viewBox="0 0 420 200"') == 10
