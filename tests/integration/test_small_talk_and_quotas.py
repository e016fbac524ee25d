"""Small talk and quotas through the pipeline: fixed replies, no search, no model, stored turns;
the visitor's day counted per address on the widget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer

from core.answer.phrases import phrase
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from core.turns import CollectingTurnOutput, TurnRequest
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.integration.test_pipeline import MODEL, PAGES, Rig, fake, rig
from tests.support.sse import chat

__all__ = ["fake", "rig"]  # the fixtures this module uses


async def _turn(rig: Rig, turn_id: object) -> Any:
    return await rig.database.pool.fetchrow(
        "SELECT mode, trace, confidence FROM turns WHERE id = $1", turn_id
    )


async def _settings(rig: Rig, **settings: object) -> None:
    await Agents(rig.database.pool).update("shop", settings=settings)


async def test_small_talk_needs_no_search_or_model_and_uses_no_quota(rig: Rig) -> None:
    await _settings(rig, quota_visitor_day=1)
    thanks = await rig.ask("Bedankt!")
    done = thanks.done
    assert done is not None
    assert done["mode"] == "smalltalk"
    assert done["answer"] == phrase("smalltalk_thanks", "nl")
    assert thanks.streamed_text == done["answer"]  # streamed like any answer
    assert thanks.sources == []
    assert done["citations"] == []
    assert done["cached"] is False
    assert "quota" not in done  # small talk is not counted
    assert rig.fake.turn_requests == []  # no model call
    turn = await _turn(rig, done["turn_id"])
    assert turn["mode"] == "smalltalk"
    assert turn["trace"]["small_talk"] == "thanks"
    assert "retrieved" not in turn["trace"]  # no search
    assert "answer_cache" not in turn["trace"]

    # A greeting with a question is a question; the small talk left the quota whole.
    rig.fake.replies[MODEL] = ["Parcels to Belgium take 2-3 working days [1]."]
    question = await rig.ask("hi, how long does delivery to Belgium take?")
    assert question.done is not None
    assert question.done["mode"] == "llm"
    assert question.done["quota"] == {"visitor_day": 0, "agent_month": None}
    # The conversation is in English now; small talk is still answered, quota or not.
    hello = await rig.ask("hello")
    assert hello.done is not None
    assert hello.done["answer"] == phrase("smalltalk_greeting", "en")
    assert len(rig.fake.turn_requests) == 1
    gaps = await rig.database.pool.fetchval("SELECT count(*) FROM content_gaps")
    assert gaps == 0


async def test_a_visitors_daily_quota_runs_out_in_their_language(rig: Rig) -> None:
    await _settings(rig, quota_visitor_day=2)
    rig.fake.replies[MODEL] = [
        "Pakketten naar België duren 2-3 werkdagen [1].",
        "De Fjord GTX kost 189,95 euro [1].",
        "De Fjord GTX is waterdicht [1].",
        "Verzending kost 4,95 euro [1].",
    ]
    first = await rig.ask("Hoe lang duurt de levering naar België?")
    second = await rig.ask("Wat kost de Fjord GTX wandelschoen?")
    assert first.done is not None
    assert second.done is not None
    assert first.done["quota"] == {"visitor_day": 1, "agent_month": None}
    assert second.done["quota"] == {"visitor_day": 0, "agent_month": None}
    asked = len(rig.fake.turn_requests)

    third = await rig.ask("Is de Fjord GTX waterdicht?")
    done = third.done
    assert done is not None
    assert done["mode"] == "quota"
    assert done["answer"].startswith(phrase("quota_visitor_day", "nl"))
    assert "hello@shop.example" in done["answer"]  # the contact route, in Dutch
    assert third.streamed_text == done["answer"]
    assert done["quota"] == {"visitor_day": 0, "agent_month": None}
    assert third.sources == []
    assert len(rig.fake.turn_requests) == asked  # no model call
    assert (await _turn(rig, done["turn_id"]))["mode"] == "quota"
    # the quota message is no content gap
    gaps = "SELECT count(*) FROM content_gaps WHERE turn_id = $1"
    assert await rig.database.pool.fetchval(gaps, done["turn_id"]) == 0

    # Another visitor has a day of their own; staff in the playground are never limited.
    other = await rig.ask("Is de Fjord GTX waterdicht?", key="conv-2")
    assert other.done is not None
    assert other.done["mode"] == "llm"
    assert other.done["quota"]["visitor_day"] == 1
    output = CollectingTurnOutput()
    await rig.pipeline.run(
        TurnRequest(agent="shop", channel="playground", conversation_key="conv-1",
                    text="Wat kost verzending naar België?"),
        output,
    )  # fmt: skip
    assert output.done is not None
    assert output.done["mode"] == "llm"
    assert output.done["quota"] == {"visitor_day": None, "agent_month": None}


async def test_the_agents_monthly_quota_spans_visitors(rig: Rig) -> None:
    rig.fake.replies[MODEL] = ["Parcels to Belgium take 2-3 working days [1]."]
    unlimited = await rig.ask("How long does delivery to Belgium take?", key="a")
    assert unlimited.done is not None
    assert unlimited.done["quota"] == {"visitor_day": None, "agent_month": None}

    # The turn above counts too: one place is left this month, for whoever comes first.
    await _settings(rig, quota_agent_month=2)
    rig.fake.replies[MODEL] = ["The Fjord GTX costs 189.95 euro [1]."]
    second = await rig.ask("How much is the Fjord GTX boot?", key="b")
    assert second.done is not None
    assert second.done["quota"] == {"visitor_day": None, "agent_month": 0}
    asked = len(rig.fake.turn_requests)
    refused = await rig.ask("Is the Fjord GTX boot waterproof?", key="c")
    assert refused.done is not None
    assert refused.done["mode"] == "quota"
    assert refused.done["answer"].startswith(phrase("quota_agent_month", "en"))
    assert len(rig.fake.turn_requests) == asked

    # The quota message itself was not counted: a third place means one more answer.
    await _settings(rig, quota_agent_month=3)
    rig.fake.replies[MODEL] = ["Yes, the Fjord GTX is waterproof [1]."]
    again = await rig.ask("Is the Fjord GTX boot waterproof?", key="c")
    assert again.done is not None
    assert again.done["mode"] == "llm"
    assert again.done["quota"]["agent_month"] == 0


async def test_a_visitor_who_starts_new_sessions_shares_their_addresss_day(rig: Rig) -> None:
    # One answer a visitor a day; an address gets five visitors' days (the default share).
    await _settings(rig, quota_visitor_day=1)
    rig.fake.replies[MODEL] = ["Parcels to Belgium take 2-3 working days [1]."] * 8

    async def ask(session: str, address: str) -> dict[str, Any]:
        output = await rig.ask(
            "How long does delivery to Belgium take?", key=session, channel="web",
            client_address=address,
        )  # fmt: skip
        assert output.done is not None
        return dict(output.done)

    first = [await ask(f"s-{n}", "198.51.100.7") for n in range(5)]
    assert "quota" not in [d["mode"] for d in first]  # answered (from the cache after one)
    # What is left is the less of the visitor's own day and their address's.
    assert [d["quota"]["visitor_day"] for d in first] == [0, 0, 0, 0, 0]
    # A sixth fresh session from the same address gets the visitor's quota message.
    sixth = await ask("s-6", "198.51.100.7")
    assert sixth["mode"] == "quota"
    assert sixth["answer"].startswith(phrase("quota_visitor_day", "en"))
    # An IPv6 visitor's /64 is one address; another address has its own day.
    for n in range(5):
        assert (await ask(f"v6-{n}", f"2001:db8:7:1::{n + 1}"))["mode"] != "quota"
    assert (await ask("v6-9", "2001:db8:7:1:ffff::9"))["mode"] == "quota"
    assert (await ask("s-7", "198.51.100.8"))["mode"] != "quota"
    # Channels that do not see the visitor's address count the conversation alone.
    api = await rig.ask("How long does delivery to Belgium take?", key="api-1")
    assert api.done is not None
    assert api.done["mode"] != "quota"


async def test_the_widget_counts_the_visitors_day_per_address(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    agent = await agents.update("shop", settings={"quota_visitor_day": 1})
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    # Behind a proxy on loopback: the visitor's address is the one it forwards.
    settings = make_settings(quota_address_share=2, trusted_proxies=["127.0.0.1/32"])
    server = TestServer(create_app(settings))
    await server.start_server()
    url = str(server.make_url("/")).rstrip("/")
    try:

        async def mode(session: str, address: str) -> str:
            stream = await chat(
                url, "shop", "How long does delivery to Belgium take?",
                key=agent.widget_key, session_id=session,
                headers={"X-Forwarded-For": address},
            )  # fmt: skip
            assert stream.status == 200, stream.events
            return str(stream.data("done")["mode"])

        answered = [await mode(f"session-{n:04}", "203.0.113.5") for n in range(2)]
        assert answered == ["extractive", "cached"]
        assert await mode("session-0009", "203.0.113.5") == "quota"
        assert await mode("session-0010", "203.0.113.6") == "cached"
    finally:
        await server.close()
