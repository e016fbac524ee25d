"""The chat model against fakes of the OpenAI-compatible servers people run (llama.cpp, Ollama,
vLLM, a strict one), each speaking its own documented wire format, through the openai client."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from core.errors import ModelFailed, ToolsUnsupported
from core.llm.openai_chat import OpenAIChatModel
from core.ports import ChatChunk, ChatMessage, Tool, Usage
from tests.fakes.openai import FakeOpenAI, calls, tool_call

MESSAGES = [
    ChatMessage("system", "You are the support assistant of Acme."),
    ChatMessage("user", "How long does shipping to Belgium take?"),
]
TOOLS = [
    Tool("ls", "List a folder.", {"type": "object", "properties": {"path": {"type": "string"}}}),
]
REPLY = "Orders to Belgium arrive within 2-3 working days."


@dataclass
class Served:
    fake: FakeOpenAI
    root: str  # the server's address, without /v1

    def model(self, name: str = "qwen3:8b", **options: Any) -> OpenAIChatModel:
        return OpenAIChatModel(name, api_key="unused", base_url=f"{self.root}/v1", **options)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[FakeOpenAI], Any]]:
    servers: list[TestServer] = []

    async def start(fake: FakeOpenAI) -> Served:
        server = TestServer(fake.app())
        await server.start_server()
        servers.append(server)
        return Served(fake, str(server.make_url("")).rstrip("/"))

    yield start
    for server in servers:
        await server.close()


async def _collect(stream: AsyncIterator[ChatChunk]) -> list[ChatChunk]:
    return [chunk async for chunk in stream]


async def test_llama_cpp_streams_its_usage_in_a_last_chunk_without_choices(serve: Any) -> None:
    served: Served = await serve(FakeOpenAI(server="llama.cpp", default_reply=REPLY))
    # On the wire, as llama-server writes it: no `usage` until the last chunk, whose
    # `choices` are empty, with its `timings`.
    body = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "Hi"}],
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{served.root}/v1/chat/completions", json=body) as response,
    ):
        events = [line[6:] async for line in _lines(response) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all("usage" not in chunk for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == len(REPLY.split())
    assert "timings" in chunks[-1]

    model = served.model()
    chunks_read = await _collect(model.stream(MESSAGES, max_tokens=100, temperature=0))
    await model.close()
    assert "".join(c.text for c in chunks_read) == REPLY
    assert chunks_read[-1] == ChatChunk(usage=Usage(prompt_tokens=14, completion_tokens=8))


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    async for raw in response.content:
        line = raw.decode().strip()
        if line:
            yield line


async def test_a_strict_server_is_asked_again_without_stream_options(serve: Any) -> None:
    served: Served = await serve(FakeOpenAI(server="strict", default_reply=REPLY))
    model = served.model()
    first = await _collect(model.stream(MESSAGES, max_tokens=100, temperature=0))
    second = await _collect(model.stream(MESSAGES, max_tokens=100, temperature=0))
    await model.close()

    # The reply is whole; its usage, which only stream_options asks for, is missing.
    for chunks in (first, second):
        assert "".join(c.text for c in chunks) == REPLY
        assert all(c.usage is None for c in chunks)
    # Refused once, by name; asked again without it, and never sent again for this model.
    assert ["stream_options" in body for body in served.fake.chat_requests] == [True, False, False]


async def test_ollama_without_the_model_fails_for_good_naming_it(serve: Any) -> None:
    served: Served = await serve(
        FakeOpenAI(server="ollama", missing_models="ollama", model_list=["llama3.2:latest"])
    )
    model = served.model("qwen3:8b")
    with pytest.raises(ModelFailed) as streamed:
        await _collect(model.stream(MESSAGES, max_tokens=100, temperature=0))
    with pytest.raises(ModelFailed) as completed:
        await model.complete(MESSAGES, max_tokens=100, temperature=0)
    await model.close()
    for error in (streamed.value, completed.value):
        assert (
            error.message == "language model failed: status 404, the server has no model 'qwen3:8b'"
        )
        assert error.transient is False
    assert len(served.fake.chat_requests) == 2  # neither tried again

    # A model it has answers; an address without Ollama's /v1 is a 404 for good, too.
    found = served.model("llama3.2")
    assert await found.complete(MESSAGES, max_tokens=100, temperature=0)
    await found.close()
    unprefixed = OpenAIChatModel("llama3.2", api_key="unused", base_url=served.root)
    with pytest.raises(ModelFailed) as wrong_address:
        await unprefixed.complete(MESSAGES, max_tokens=100, temperature=0)
    await unprefixed.close()
    assert wrong_address.value.message == "language model failed: status 404"
    assert wrong_address.value.transient is False


@pytest.mark.parametrize(
    ("server", "answered"),
    [
        # llama.cpp drops the tools of a chat template without them: asked for a call, the
        # model answers in text.
        ("llama.cpp", 0),
        # Ollama refuses tools for a model without them, at once.
        ("ollama", 0),
        # vLLM without a tool parser makes the asked-for call (guided decoding) and refuses
        # "auto", the next request.
        ("vllm", 1),
    ],
)
async def test_a_server_without_tools_is_found_out_and_remembered(
    serve: Any, server: str, answered: int
) -> None:
    fake = FakeOpenAI(server=server, tools_supported=False, default_reply=REPLY)  # type: ignore[arg-type]
    fake.tool_replies = [calls(tool_call("ls", {"path": "/"}))] if answered else []
    served: Served = await serve(fake)
    model = served.model()
    for _ in range(answered):
        reply = await model.respond(MESSAGES, tools=TOOLS, max_tokens=100, temperature=0)
        assert [call.name for call in reply.tool_calls] == ["ls"]
    with pytest.raises(ToolsUnsupported) as unsupported:
        await model.respond(MESSAGES, tools=TOOLS, max_tokens=100, temperature=0)
    assert unsupported.value.transient is False
    asked = len(fake.chat_requests)
    assert asked == answered + 1
    assert fake.chat_requests[0]["tool_choice"] == "required"

    # Remembered: no request, until the memory lapses; then the server is asked again.
    with pytest.raises(ToolsUnsupported):
        await model.respond(MESSAGES, tools=TOOLS, max_tokens=100, temperature=0)
    assert len(fake.chat_requests) == asked
    model._tool_support.clear()  # as when `tool_support_seconds` have passed
    with contextlib.suppress(ToolsUnsupported):  # vLLM makes the asked-for call again
        await model.respond(MESSAGES, tools=TOOLS, max_tokens=100, temperature=0)
    assert len(fake.chat_requests) == asked + 1
    # Without tools, the model answers as ever.
    assert await model.complete(MESSAGES, max_tokens=100, temperature=0) == REPLY
    await model.close()


async def test_vllm_streams_reasoning_apart_from_the_answer(serve: Any) -> None:
    served: Served = await serve(
        FakeOpenAI(server="vllm", reasoning="The visitor asks about Belgium.", default_reply=REPLY)
    )
    body = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{served.root}/v1/chat/completions", json=body) as response,
    ):
        events = [line[6:] async for line in _lines(response) if line.startswith("data: ")]
    deltas = [json.loads(event)["choices"][0]["delta"] for event in events[:-1]]
    thought = "".join(d.get("reasoning_content") or "" for d in deltas)
    said = "".join(d.get("content") or "" for d in deltas)
    assert (thought, said) == ("The visitor asks about Belgium.", REPLY)
