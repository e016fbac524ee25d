"""The knowledge-query contract (`:process`, `:search`), query translation and related
reading, through the gateway built by create_app, with the openai client against the fake."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.answer.pipeline import AnswerPipeline
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.retrieval.retriever import RetrievalQuery
from core.store import Agent, Agents, Database
from core.store.api_keys import ApiKeys
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from core.turns import CollectingTurnOutput, TurnRequest
from gateway.admin.events import RelatedData
from gateway.app import create_app
from gateway.keys import ANSWERING, DATABASE
from tests.conftest import MakeSettings
from tests.fakes.openai import FakeOpenAI
from tests.support.sse import chat

MODEL = "gpt-test"
REWRITE_MODEL = "rewrite-test"
TRANSLATE_MODEL = "translate-test"
PAGES = [
    {"url": "/en/shipping", "title": "Shipping", "lang": "en", "tags": ["shipping"],
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days. Orders to Germany "
             "arrive in 3-4 working days. Shipping costs 4.95 euro."},
    {"url": "/en/faq", "title": "FAQ", "lang": "en", "tags": ["faq"],
     "text": "# FAQ\n## Delivery\nParcels to Belgium and Germany are delivered by DHL and bpost "
             "within a few working days."},
    {"url": "/en/delivery-times", "title": "Delivery times", "lang": "en", "tags": ["shipping"],
     "text": "# Delivery times\nDelivery to Germany takes 3-4 working days; delivery to Belgium "
             "2-3 working days."},
    {"url": "/b2b/shipping", "title": "Shipping for business customers", "lang": "en",
     "tags": ["business"],
     "text": "# Shipping for business customers\nBusiness orders to Belgium and Germany are "
             "shipped on pallets within 5 working days."},
    {"url": "/en/returns", "title": "Returns", "lang": "en", "tags": ["returns"],
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 "
             "working days."},
]  # fmt: skip
TAGS = {page["url"]: page["tags"] for page in PAGES}
DUTCH = "Hoe lang duurt de levering naar Duitsland?"
ENGLISH = "How long does delivery to Germany take?"
ANSWER = "Orders to Germany arrive in 3-4 working days [1]."
PROCESS = "/api/v1/pipelines/shop:process"
SEARCH = "/api/v1/pipelines/shop:search"


def respond(body: dict[str, Any]) -> str:
    """The fake model: translates the Dutch question, and answers citing source 1."""
    if body["model"] == TRANSLATE_MODEL:
        return ENGLISH if DUTCH in str(body["messages"][-1]["content"]) else "?"
    return ANSWER


@dataclass
class Shop:
    url: str
    agent: Agent
    key: str
    other_key: str  # an API key of another agent
    fake: FakeOpenAI
    database: Database
    pipeline: AnswerPipeline

    async def post(self, path: str, body: Any, key: str | None = None) -> httpx.Response:
        """``body`` posted with this agent's API key (or ``key``; "" for none)."""
        token = self.key if key is None else key
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            return await client.post(path, json=body, headers=headers)

    async def trace(self, turn_id: int) -> dict[str, Any]:
        trace: dict[str, Any] = await self.database.pool.fetchval(
            "SELECT trace FROM turns WHERE id = $1", turn_id
        )
        return trace

    def asked(self, model: str) -> list[dict[str, Any]]:
        """The chat requests the turns sent to ``model``, in order."""
        return [body for body in self.fake.turn_requests if body["model"] == model]


@pytest.fixture
async def shop(
    make_settings: MakeSettings, use_embedder: UseEmbedder, tmp_path: Path
) -> AsyncIterator[Shop]:
    fake = FakeOpenAI(responder=respond)
    llm = TestServer(fake.app())
    await llm.start_server()
    settings = make_settings(
        llm_base_url=str(llm.make_url("/v1")), llm_api_key="sk-test", llm_model=MODEL,
        rewrite_model=REWRITE_MODEL, translate_model=TRANSLATE_MODEL,
    )  # fmt: skip
    app: web.Application = create_app(settings)
    server = TestServer(app)
    await server.start_server()
    database = app[DATABASE]
    agents = Agents(database.pool)
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    other = await agents.create("other", embedder=EmbedderIdentity.of(use_embedder))
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    keys = ApiKeys(database.pool)
    yield Shop(
        str(server.make_url("")).rstrip("/"),
        await agents.get("shop"),
        await keys.create(agent.id, "crm"),
        await keys.create(other.id, "crm"),
        fake,
        database,
        app[ANSWERING].pipeline,
    )
    await server.close()
    await llm.close()


async def test_process_answers_a_follow_up_from_the_callers_own_conversation(shop: Shop) -> None:
    # The session's stored memory is about returns; the caller's own conversation, sent
    # with the follow-up, is about delivery: the follow-up is read from what was sent.
    first = await shop.post(PROCESS, {"query": "Can I return a jacket?", "session_id": "crm-7"})
    assert first.status_code == 200, first.text
    await shop.pipeline.memory.drain()
    shop.fake.replies[REWRITE_MODEL] = ["delivery time to Germany"]
    answered = await shop.post(
        PROCESS,
        {
            "query": "and to Germany?",
            "query_language": "en",
            "session_id": "crm-7",
            "max_results": 3,
            "previous_messages": [
                {"role": "user", "content": "How long does delivery to Belgium take?"},
                {"role": "assistant", "content": "Orders to Belgium take 2-3 working days [1]."},
            ],
            "parameters": {},
            "filters": {"include_tags": ["shipping", "faq"], "exclude_tags": ["business"]},
        },
    )
    assert answered.status_code == 200, answered.text
    body = answered.json()
    assert body["answer"] == ANSWER
    assert body["session_id"] == "crm-7"
    assert body["mode"] == "llm"
    assert isinstance(body["confidence"], float)
    [source] = body["sources"]  # the one the answer cites
    assert set(source) == {"id", "title", "url", "score"}
    assert source["url"] in ("/en/shipping", "/en/delivery-times")
    assert source["title"] in ("Shipping", "Delivery times")

    [rewrite] = shop.asked(REWRITE_MODEL)
    transcript = rewrite["messages"][-1]["content"]
    assert "visitor: How long does delivery to Belgium take?" in transcript
    assert "assistant: Orders to Belgium take 2-3 working days [1]." in transcript
    assert "return" not in transcript  # the stored memory was not used
    answer_request = shop.asked(MODEL)[-1]
    assert [m["role"] for m in answer_request["messages"]] == [
        "system", "user", "assistant", "user"
    ]  # fmt: skip
    assert answer_request["messages"][-1]["content"] == "and to Germany?"
    assert answer_request["messages"][0]["content"].count("<source id=") <= 3  # max_results

    trace = await shop.trace(body["turn_id"])
    assert trace["rewrite"] == "llm"
    assert trace["rewritten_query"] == "delivery time to Germany"
    retrieved = {hit["url"] for hit in trace["retrieved"]}
    assert retrieved, trace
    assert all(TAGS[url][0] in ("shipping", "faq") for url in retrieved)
    # Related reading respects the filters too, and never repeats a source.
    assert len(body["related"]) <= 3
    for page in body["related"]:
        assert set(page) == {"title", "url"}
        assert page["url"] != source["url"]
        assert TAGS[page["url"]][0] in ("shipping", "faq")


async def test_search_finds_pages_by_tag_and_returns_what_it_examined(shop: Shop) -> None:
    found = await shop.post(
        SEARCH,
        {
            "query": ENGLISH,
            "max_results": 3,
            "filters": {"include_tags": [], "exclude_tags": []},
            "response_options": {"return_examined_corpus_str": True},
        },
    )
    assert found.status_code == 200, found.text
    body = found.json()
    results = body["results"]
    assert 1 < len(results) <= 3
    urls = [r["url"] for r in results]
    assert len(set(urls)) == len(urls)  # one result per page
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    by_url = {r["url"]: r for r in results}
    assert "/en/delivery-times" in by_url or "/en/shipping" in by_url
    for result in results:
        assert set(result) == {"title", "url", "body", "score", "tags", "passed"}
        assert result["tags"] == TAGS[result["url"]]
        assert result["body"] in next(p["text"] for p in PAGES if p["url"] == result["url"])
    corpus = body["examined_corpus_str"]
    pages = corpus.split("\n\n" + "=" * 40 + "\n\n")
    assert len(pages) == len(results)
    for number, (page, result) in enumerate(zip(pages, results, strict=True), start=1):
        assert page.startswith(f"[{number}] {result['title']}\nURL: {result['url']}\n")
        assert result["body"] in page

    business = (
        await shop.post(SEARCH, {"query": ENGLISH, "filters": {"include_tags": ["business"]}})
    ).json()
    assert [r["url"] for r in business["results"]] == ["/b2b/shipping"]
    assert business["results"][0]["tags"] == ["business"]
    assert "examined_corpus_str" not in business  # not asked for
    others = (
        await shop.post(
            SEARCH, {"query": ENGLISH, "filters": {"exclude_tags": ["business", "shipping"]}}
        )
    ).json()
    assert others["results"]
    assert {r["url"] for r in others["results"]} <= {"/en/faq", "/en/returns"}

    # An answer is made only from the pages the filters let through.
    answered = await shop.post(
        PROCESS, {"query": ENGLISH, "filters": {"include_tags": ["business"]}}
    )
    assert answered.status_code == 200, answered.text
    assert [s["url"] for s in answered.json()["sources"]] == ["/b2b/shipping"]
    assert answered.json()["related"] == []  # nothing else may be read


async def test_a_question_in_another_language_is_searched_in_the_knowledges_language(
    shop: Shop,
) -> None:
    answered = await shop.post(PROCESS, {"query": DUTCH, "query_language": "nl"})
    assert answered.status_code == 200, answered.text
    [translate] = shop.asked(TRANSLATE_MODEL)
    assert translate["temperature"] == 0
    assert "into English" in translate["messages"][0]["content"]
    assert translate["messages"][-1]["content"] == f"<query>\n{DUTCH}\n</query>"
    # The answer is asked for in the visitor's own words.
    assert shop.asked(MODEL)[-1]["messages"][-1]["content"] == DUTCH
    trace = await shop.trace(answered.json()["turn_id"])
    assert trace["language"] == "nl"
    assert trace["translated_query"] == ENGLISH
    assert trace["translation"]["from"] == "nl"
    assert trace["translation"]["to"] == "en"
    assert trace["translation"]["method"] == "llm"
    # What was searched is the translation: the best passage matched as the English does.
    retriever = shop.pipeline.retriever
    english = await retriever.retrieve(RetrievalQuery(shop.agent, ENGLISH, reply_language="en"))
    dutch = await retriever.retrieve(RetrievalQuery(shop.agent, DUTCH, reply_language="en"))
    best = trace["retrieved"][0]
    assert (best["chunk_id"], best["match"]) == (
        english.ranked[0].chunk_id,
        english.ranked[0].match,
    )
    assert best["match"] != dutch.ranked[0].match

    # Asked again for fewer sources (another answer, so the question is searched again): the
    # translation is remembered.
    again = await shop.post(PROCESS, {"query": DUTCH, "session_id": "another", "max_results": 3})
    assert (await shop.trace(again.json()["turn_id"]))["translation"]["method"] == "cached"
    assert len(shop.asked(TRANSLATE_MODEL)) == 1

    # A translation that fails leaves the question as it was asked.
    shop.fake.replies[TRANSLATE_MODEL] = [""]
    failed = await shop.post(PROCESS, {"query": "Hoe lang duurt de levering naar België?"})
    assert failed.status_code == 200, failed.text
    trace = await shop.trace(failed.json()["turn_id"])
    assert trace["translated_query"] is None
    assert trace["translation"]["method"] == "failed"
    assert trace["translation"]["reason"] == "empty"


async def test_related_reading_comes_after_the_sources_on_the_widget_only(shop: Shop) -> None:
    stream = await chat(shop.url, "shop", ENGLISH, key=shop.agent.widget_key)
    assert stream.status == 200
    assert stream.kinds()[-3:] == ["sources", "related", "done"]
    shown = {s["url"] for s in stream.data("sources")["sources"]}
    related = stream.data("related")["related"]
    assert 1 <= len(related) <= 3
    assert all(set(page) == {"title", "url"} and page["url"] not in shown for page in related)
    titles = {page["url"]: page["title"] for page in PAGES}
    assert all(page["title"] == titles[page["url"]] for page in related)
    RelatedData.model_validate(stream.data("related"))  # as the OpenAPI document says
    trace = await shop.trace(stream.data("done")["turn_id"])
    assert trace["related"] == [page["url"] for page in related]

    # An answer that defers offers nothing to read on.
    shop.fake.replies[MODEL] = ["I couldn't verify this from the information on our website."]
    deferred = await chat(
        shop.url, "shop", ENGLISH, key=shop.agent.widget_key, session_id="session-0002"
    )
    assert deferred.kinds()[-2:] == ["sources", "done"]
    # A messaging channel sends one reply with its sources: no related reading is looked for.
    output = CollectingTurnOutput()
    await shop.pipeline.run(
        TurnRequest(
            agent="shop", channel="whatsapp", conversation_key="whatsapp:+31612345678", text=ENGLISH
        ),
        output,
    )
    assert output.done is not None
    assert output.related == []
    assert [e.kind for e in output.events][-2:] == ["sources", "done"]


async def test_the_api_key_and_the_body_are_checked(shop: Shop) -> None:
    for path, body in ((PROCESS, {"query": ENGLISH}), (SEARCH, {"query": ENGLISH})):
        assert (await shop.post(path, body, key="")).status_code == 401
        assert (await shop.post(path, body, key="sk_nope")).status_code == 401
        other = await shop.post(path, body, key=shop.other_key)
        assert other.status_code == 403
        assert other.json()["error"]["message"] == "this API key belongs to another agent"
    unknown = await shop.post("/api/v1/pipelines/nobody:process", {"query": ENGLISH})
    assert unknown.status_code == 404
    # The agent's name cannot take the operation's colon.
    assert (await shop.post("/api/v1/pipelines/shop:x:search", {"query": "x"})).status_code == 404

    refused = {
        PROCESS: [
            ({"query": "  "}, "query:"),
            ({"query": "hi", "parameters": {"temperature": 0.2}}, "parameters.temperature:"),
            ({"query": "hi", "stream": True}, "stream:"),
            ({"query": "hi", "previous_messages": [{"role": "system", "content": "x"}]},
             "previous_messages.0.role:"),
            ({"query": "hi", "max_results": 21}, "max_results:"),
            ({"query": "hi", "query_language": "Dutch please"}, "query_language:"),
            ({"query": "hi", "filters": {"include_tags": ["not a tag"]}},
             "filters.include_tags: 'not a tag' is not a tag"),
            ({"query": "hi", "filters": {"include_tag": ["pricing"]}}, "filters.include_tag:"),
        ],
        SEARCH: [
            ({"max_results": 3}, "query:"),
            ({"query": "hi", "max_results": 0}, "max_results:"),
            ({"query": "hi", "response_options": {"return_examined_corpus": True}},
             "response_options.return_examined_corpus:"),
        ],
    }  # fmt: skip
    for path, cases in refused.items():
        for body, where in cases:
            response = await shop.post(path, body)
            assert response.status_code == 400, (body, response.text)
            error = response.json()["error"]
            assert error["code"] == "invalid_input"
            assert error["message"].startswith(where), (body, error)
    async with httpx.AsyncClient(base_url=shop.url) as client:
        not_json = await client.post(
            SEARCH, content=b"{query", headers={"Authorization": f"Bearer {shop.key}"}
        )
    assert not_json.status_code == 400
    assert shop.fake.turn_requests == []  # nothing refused reached the model
