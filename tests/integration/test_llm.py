"""The chat model for real: the openai client against the local fake OpenAI server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from core.errors import ModelFailed, Unavailable
from core.llm.openai_chat import OpenAIChatModel, close_chat_model, open_chat_model
from core.ports import ChatChunk, ChatMessage, Usage
from core.settings import Settings
from tests.fakes.openai import FakeOpenAI
from tests.support.services import free_port

KEY = "sk-test-0123456789abcdef"
MESSAGES = [
    ChatMessage("system", "You are the support assistant of Acme."),
    ChatMessage("user", "How long does shipping take?"),
    ChatMessage("assistant", "Which country?"),
    ChatMessage("user", "Belgium"),
]


@dataclass
class Served:
    fake: FakeOpenAI
    url: str

    def model(self, **options: float) -> OpenAIChatModel:
        return OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=self.url, **options)  # type: ignore[arg-type]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    fake = FakeOpenAI()
    server = TestServer(fake.app())
    await server.start_server()
    yield Served(fake, str(server.make_url("/v1")))
    await server.close()


async def _collect(stream: AsyncIterator[ChatChunk]) -> list[ChatChunk]:
    return [chunk async for chunk in stream]


async def _read_into(stream: AsyncIterator[ChatChunk], received: list[str]) -> None:
    """Keeps what arrived before the stream fails."""
    async for chunk in stream:
        received.append(chunk.text)


async def test_a_reply_streams_in_order_with_usage_and_the_request_as_sent(
    served: Served,
) -> None:
    served.fake.replies["gpt-4o-mini"] = ["Orders to Belgium arrive within 2-3 working days [1]."]
    model = served.model()
    chunks = await _collect(model.stream(MESSAGES, max_tokens=300, temperature=0.2))
    await model.close()

    texts = [c.text for c in chunks if c.text]
    assert len(texts) == 9  # one delta per word
    assert texts[:3] == ["Orders", " to", " Belgium"]
    assert "".join(texts) == "Orders to Belgium arrive within 2-3 working days [1]."
    assert chunks[-1] == ChatChunk(usage=Usage(prompt_tokens=15, completion_tokens=9))
    assert all(c.usage is None for c in chunks[:-1])

    (body,) = served.fake.chat_requests
    assert body["model"] == "gpt-4o-mini"
    assert body["messages"] == [{"role": m.role, "content": m.content} for m in MESSAGES]
    assert body["temperature"] == 0.2
    assert body["max_tokens"] == 300
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert served.fake.requests[0]["auth"] == f"Bearer {KEY}"
    assert served.fake.streams_completed == 1


async def test_tokens_arrive_while_the_model_is_still_writing(served: Served) -> None:
    served.fake.replies["gpt-4o-mini"] = ["one two three four five"]
    served.fake.token_delay = 0.1
    model = served.model()
    loop = asyncio.get_running_loop()
    arrivals = [
        loop.time() async for c in model.stream(MESSAGES, max_tokens=50, temperature=0) if c.text
    ]
    await model.close()
    assert len(arrivals) == 5
    assert arrivals[-1] - arrivals[0] >= 0.35  # spread out, not delivered in one piece


async def test_the_model_can_be_overridden_per_call(served: Served) -> None:
    served.fake.replies["gpt-4.1-nano"] = ["shipping time Belgium"]
    model = served.model()
    reply = await model.complete(
        MESSAGES, max_tokens=40, temperature=0.0, model="gpt-4.1-nano", timeout=2.0
    )
    chunks = await _collect(model.stream(MESSAGES, max_tokens=40, temperature=0, model="gpt-x"))
    await model.close()
    assert reply == "shipping time Belgium"
    assert [b["model"] for b in served.fake.chat_requests] == ["gpt-4.1-nano", "gpt-x"]
    assert "".join(c.text for c in chunks) == served.fake.default_reply


async def test_complete_returns_the_whole_reply(served: Served) -> None:
    served.fake.responder = lambda body: f"You said: {body['messages'][-1]['content']}"
    model = served.model()
    reply = await model.complete(MESSAGES, max_tokens=60, temperature=0.0)
    await model.close()
    assert reply == "You said: Belgium"
    (body,) = served.fake.chat_requests
    assert body["max_tokens"] == 60
    assert body["temperature"] == 0.0
    assert not body.get("stream")


async def test_a_slow_first_token_times_out_and_the_request_is_dropped(served: Served) -> None:
    served.fake.first_token_delay = 5.0
    model = served.model(first_token_timeout=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Unavailable, match="timeout"):
        await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    assert loop.time() - started < 1.5
    await asyncio.wait_for(served.fake.disconnected.wait(), 2)
    await model.close()
    assert served.fake.streams_completed == 0


async def test_a_server_that_never_answers_times_out(served: Served) -> None:
    served.fake.hang = True
    model = served.model(queue_timeout=0.3)
    with pytest.raises(Unavailable, match="timeout"):
        await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    with pytest.raises(Unavailable, match="timeout"):
        await model.complete(MESSAGES, max_tokens=20, temperature=0, timeout=0.2)
    await model.close()


async def test_the_overall_timeout_bounds_a_slow_stream(served: Served) -> None:
    served.fake.replies["gpt-4o-mini"] = [" ".join(["word"] * 50)]
    served.fake.token_delay = 0.1
    model = served.model(first_token_timeout=1.0, total_timeout=0.5)
    received: list[str] = []
    with pytest.raises(Unavailable, match="timeout"):
        await _read_into(model.stream(MESSAGES, max_tokens=50, temperature=0), received)
    await model.close()
    assert 2 <= len(received) < 10


async def test_server_errors_become_unavailable_without_the_key(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    served.fake.chat_failures = [500, 500, 500, 500]
    served.fake.error_message = f"upstream rejected Authorization: Bearer {KEY}"
    model = served.model(backoff=0.01)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Unavailable) as streamed:
        await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    with pytest.raises(Unavailable) as completed:
        await model.complete(MESSAGES, max_tokens=50, temperature=0)
    await model.close()
    for error in (streamed.value, completed.value):
        assert error.message == "language model failed: status 500"
        assert KEY not in str(error)
        assert error.code == "unavailable"
    assert KEY not in caplog.text
    assert "llm.stream.failed" in caplog.text
    assert len(served.fake.chat_requests) == 4  # each call tried twice


async def test_one_transient_failure_is_retried(served: Served) -> None:
    served.fake.chat_failures = [502]
    served.fake.replies["gpt-4o-mini"] = ["Fine."]
    model = served.model(backoff=0.01)
    chunks = await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    await model.close()
    assert "".join(c.text for c in chunks) == "Fine."
    assert len(served.fake.chat_requests) == 2


async def test_a_client_error_is_not_retried(served: Served) -> None:
    served.fake.chat_failures = [401]
    model = served.model(backoff=0.01)
    with pytest.raises(Unavailable, match="status 401"):
        await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    await model.close()
    assert len(served.fake.chat_requests) == 1


@pytest.mark.parametrize(
    ("status", "transient"),
    [(400, False), (401, False), (403, False), (404, False), (429, True), (500, True),
     (503, True)],
)  # fmt: skip
async def test_a_failure_says_whether_a_later_try_may_work(
    served: Served, status: int, transient: bool
) -> None:
    served.fake.chat_down_with = status
    model = served.model(backoff=0.01)
    with pytest.raises(ModelFailed) as streamed:
        await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    with pytest.raises(ModelFailed) as completed:
        await model.complete(MESSAGES, max_tokens=50, temperature=0)
    await model.close()
    for error in (streamed.value, completed.value):
        assert error.message == f"language model failed: status {status}"
        assert error.transient is transient


async def test_timeouts_and_refused_connections_are_transient(served: Served) -> None:
    served.fake.hang = True
    model = served.model(first_token_timeout=0.2, total_timeout=1.0)
    with pytest.raises(ModelFailed, match="timeout") as timed_out:
        await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    await model.close()
    assert timed_out.value.transient
    nobody = OpenAIChatModel(
        "gpt-4o-mini", api_key=KEY, base_url=f"http://127.0.0.1:{free_port()}/v1", backoff=0.01
    )
    with pytest.raises(ModelFailed, match="connection failed") as refused:
        await _collect(nobody.stream(MESSAGES, max_tokens=50, temperature=0))
    await nobody.close()
    assert refused.value.transient


async def test_a_connection_dropped_mid_stream_is_unavailable(served: Served) -> None:
    served.fake.replies["gpt-4o-mini"] = ["one two three four five six"]
    served.fake.break_after = 3
    model = served.model()
    received: list[str] = []
    with pytest.raises(Unavailable, match="connection failed"):
        await _read_into(model.stream(MESSAGES, max_tokens=50, temperature=0), received)
    await model.close()
    assert received == ["one", " two", " three"]


@pytest.mark.parametrize(
    ("second", "reason"),
    [
        (b'{"error": {"message": "overloaded", "type": "server_error"}}', "APIError"),
        (b'{"choices": [{"index": 0, "delta": {"content": 42}}]}', "ValueError"),
        (b'["not", "a", "chunk"]', "ValueError"),
    ],
)
async def test_an_error_or_a_malformed_piece_mid_stream_fails_the_reply(
    second: bytes, reason: str
) -> None:
    """What came before stays with the caller; what cannot be read is no reply."""

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n')
        await response.write(b"data: " + second + b"\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    server = TestServer(app)
    await server.start_server()
    model = OpenAIChatModel("m", api_key=KEY, base_url=str(server.make_url("/v1")))
    received: list[str] = []
    with pytest.raises(ModelFailed, match=reason):
        await _read_into(model.stream(MESSAGES, max_tokens=50, temperature=0), received)
    await model.close()
    await server.close()
    assert received == ["Hi"]


async def test_cancelling_mid_stream_closes_the_connection(served: Served) -> None:
    served.fake.replies["gpt-4o-mini"] = [" ".join(["word"] * 100)]
    served.fake.token_delay = 0.05
    model = served.model()
    received: list[str] = []
    two_arrived = asyncio.Event()

    async def visitor() -> None:
        async for chunk in model.stream(MESSAGES, max_tokens=500, temperature=0):
            received.append(chunk.text)
            if len(received) == 2:
                two_arrived.set()

    task = asyncio.create_task(visitor())
    await asyncio.wait_for(two_arrived.wait(), 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(served.fake.disconnected.wait(), 1)
    await model.close()
    assert served.fake.disconnects == 1
    assert served.fake.streams_completed == 0
    assert len(received) < 10


async def test_a_consumer_that_stops_early_closes_the_connection(served: Served) -> None:
    served.fake.replies["gpt-4o-mini"] = [" ".join(["word"] * 100)]
    served.fake.token_delay = 0.05
    model = served.model()
    async with aclosing(model.stream(MESSAGES, max_tokens=500, temperature=0)) as stream:
        async for _ in stream:
            break
    await asyncio.wait_for(served.fake.disconnected.wait(), 1)
    await model.close()
    assert served.fake.streams_completed == 0


async def test_open_chat_model_follows_the_settings(served: Served) -> None:
    unconfigured = Settings(_env_file=None, llm_api_key=None)  # type: ignore[call-arg]
    assert open_chat_model(unconfigured) is None

    settings = Settings(  # type: ignore[call-arg]
        _env_file=None, llm_base_url=served.url, llm_api_key=KEY, llm_model="local-llama"
    )
    model = open_chat_model(settings)
    assert isinstance(model, OpenAIChatModel)
    assert model.model == "local-llama"
    served.fake.replies["local-llama"] = ["Hallo!"]
    assert await model.complete(MESSAGES, max_tokens=10, temperature=0) == "Hallo!"
    assert served.fake.requests[-1]["auth"] == f"Bearer {KEY}"
    await close_chat_model(model)


# -- the three deadlines of a streamed reply: queue, first token, whole answer -------------------


async def test_a_server_that_queues_the_request_past_the_first_token_limit_still_answers(
    served: Served,
) -> None:
    """llama.cpp with every slot busy holds the response back until one is free: that wait
    counts against the queue limit, and the first token's time starts when the response
    does."""
    served.fake.headers_delay = 0.8
    served.fake.first_token_delay = 0.3
    served.fake.replies["gpt-4o-mini"] = ["Two to three working days."]
    model = served.model(queue_timeout=3.0, first_token_timeout=0.5, total_timeout=5.0)
    chunks = await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    await model.close()
    assert "".join(c.text for c in chunks) == "Two to three working days."
    assert served.fake.streams_completed == 1


async def test_a_server_that_queues_past_the_queue_limit_fails_transiently_saying_so(
    served: Served,
) -> None:
    served.fake.headers_delay = 5.0
    model = served.model(queue_timeout=0.4, first_token_timeout=3.0, total_timeout=5.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ModelFailed) as failed:
        await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    assert loop.time() - started < 1.5
    await asyncio.wait_for(served.fake.disconnected.wait(), 2)
    await model.close()
    assert failed.value.transient
    assert failed.value.message == (
        "language model failed: timeout: the server did not begin its response within 0.4 s "
        "(queue limit)"
    )
    assert served.fake.streams_completed == 0


async def test_a_response_without_text_within_the_first_token_limit_fails_saying_so(
    served: Served,
) -> None:
    """The headers come after a short queue, then nothing: the first token's limit runs
    from the response's start, not from the request."""
    served.fake.headers_delay = 0.3
    served.fake.first_token_delay = 5.0
    model = served.model(queue_timeout=2.0, first_token_timeout=0.5, total_timeout=5.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ModelFailed) as failed:
        await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    assert 0.75 <= loop.time() - started < 2.0  # 0.3 s queued, then 0.5 s for the first word
    await model.close()
    assert failed.value.transient
    assert failed.value.message == (
        "language model failed: timeout: no text after the response began within 0.5 s "
        "(first_token limit)"
    )


async def test_the_timeouts_are_read_from_the_environment(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PARLEY_LLM_*_TIMEOUT_SECONDS reach the chat model the composition root opens: with
    the defaults (20 s for the first token) a queue of 0.8 s would be fine too, so the first
    token is made to take longer than the configured limit after a queue within its own."""
    monkeypatch.setenv("PARLEY_LLM_BASE_URL", served.url)
    monkeypatch.setenv("PARLEY_LLM_API_KEY", KEY)
    monkeypatch.setenv("PARLEY_LLM_QUEUE_TIMEOUT_SECONDS", "2")
    monkeypatch.setenv("PARLEY_LLM_FIRST_TOKEN_TIMEOUT_SECONDS", "0.4")
    monkeypatch.setenv("PARLEY_LLM_ANSWER_TIMEOUT_SECONDS", "3")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    model = open_chat_model(settings)
    assert model is not None
    served.fake.headers_delay = 0.8
    served.fake.first_token_delay = 0.2
    chunks = await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    assert "".join(c.text for c in chunks) == served.fake.default_reply
    served.fake.first_token_delay = 1.0
    with pytest.raises(ModelFailed, match=r"within 0\.4 s \(first_token limit\)"):
        await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    await close_chat_model(model)


@pytest.mark.parametrize("server", ["vllm", "ollama"])
async def test_thinking_sent_apart_is_no_text_and_counts_as_the_model_at_work(
    served: Served, server: str
) -> None:
    served.fake.server = server  # type: ignore[assignment]
    served.fake.reasoning = "The visitor asks about Belgium. My instructions say: cite [1]."
    served.fake.replies["gpt-4o-mini"] = ["Parcels take 2-3 days [1]."]
    served.fake.first_token_delay = 0.6  # longer than the first-token limit: the model thinks
    model = served.model(first_token_timeout=0.3)
    chunks = await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    await model.close()
    assert "".join(c.text for c in chunks) == "Parcels take 2-3 days [1]."
    [last] = [c for c in chunks if c.thought_seconds is not None]
    assert last.thought_seconds is not None
    assert last.thought_seconds >= 0


async def test_thinking_written_inline_is_no_text(served: Served) -> None:
    reply = "<think>They want Belgium; the prompt says to cite.</think>\nParcels take 2-3 days [1]."
    served.fake.replies["gpt-4o-mini"] = [reply]
    model = served.model()
    chunks = await _collect(model.stream(MESSAGES, max_tokens=50, temperature=0))
    served.fake.replies["gpt-4o-mini"] = [reply]
    whole = await model.complete(MESSAGES, max_tokens=50, temperature=0)
    await model.close()
    assert "".join(c.text for c in chunks) == "Parcels take 2-3 days [1]."
    assert whole == "Parcels take 2-3 days [1]."
