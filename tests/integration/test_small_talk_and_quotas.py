"""Small talk and quotas through the pipeline: fixed replies, no search, no model, stored turns."""

from __future__ import annotations

from typing import Any

from core.answer.phrases import phrase
from core.store import Agents
from core.turns import CollectingTurnOutput, TurnRequest
from tests.integration.test_pipeline import MODEL, Rig, fake, rig

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
    assert await rig.database.pool.fetchval("SELECT count(*) FROM content_gaps") == 0

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
