"""A local OpenAI-compatible server: embeddings, and scriptable chat and audio transcriptions."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from aiohttp import web

from core.memory.summary import TOPIC_INSTRUCTIONS

Responder = Callable[[dict[str, Any]], str]
# A request offering tools -> the assistant message in OpenAI's wire format (`tool_calls`).
ToolResponder = Callable[[dict[str, Any]], dict[str, Any]]
# Audio bytes -> transcript.
Transcriber = Callable[[bytes], str]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}
_POLL = 0.01  # how often a waiting handler looks whether the client is still there
# What OpenAI's transcription endpoint accepts, told by the file name's extension.
AUDIO_FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm")
# OpenAI refuses larger uploads.
MAX_AUDIO_BYTES = 25 * 1024 * 1024

# The OpenAI-compatible server a fake speaks like (`FakeOpenAI.server`).
Server = Literal["openai", "llama.cpp", "ollama", "vllm", "strict"]
# The error types of the other servers, by status (llama.cpp's format_error_response, vLLM's
# exception names, Ollama's openai.NewError).
_LLAMA_CPP_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
_VLLM_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    501: "NotImplementedError",
}
_OLLAMA_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}
# The request fields the strict server knows (a request model that forbids extra fields, as
# vLLM's and FastChat's once did): `stream_options` and `parallel_tool_calls` are not among them.
STRICT_FIELDS = frozenset(
    {
        "model", "messages", "max_tokens", "temperature", "top_p", "n", "stop", "stream",
        "presence_penalty", "frequency_penalty", "logit_bias", "user", "seed",
        "response_format", "tools", "tool_choice",
    }
)  # fmt: skip


def fake_vector(text: str, dimension: int) -> list[float]:
    """A stable pseudo-random unit vector per text; equal texts give equal vectors."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    vector = np.random.default_rng(seed).normal(size=dimension)
    return [float(x) for x in vector / np.linalg.norm(vector)]


def split_deltas(text: str) -> list[str]:
    """Word-sized pieces keeping their spaces; joined they give back ``text``."""
    return re.findall(r"\s*\S+|\s+$", text)


def _error(status: int, message: str) -> web.Response:
    body = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "server_error"),
            "param": None,
            "code": None,
        }
    }
    headers = {"retry-after-ms": "10"} if status == 429 else None
    return web.json_response(body, status=status, headers=headers)


def is_topic_request(body: dict[str, Any]) -> bool:
    """Whether a chat request asks for a conversation's topic: memory sends one in the
    background once a conversation has its first exchange, besides what the turn sends."""
    messages = body.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    return isinstance(first, dict) and first.get("content") == TOPIC_INSTRUCTIONS


def audio_key(audio: bytes) -> str:
    """The key of ``FakeOpenAI.transcripts``: the audio's sha256, in hex."""
    return hashlib.sha256(audio).hexdigest()


def tool_call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """One tool call as OpenAI writes it in an assistant message (arguments are JSON text)."""
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def calls(*tool_calls: dict[str, Any]) -> dict[str, Any]:
    """An assistant message asking for ``tool_calls`` (made with `tool_call`), no text."""
    return {"content": None, "tool_calls": list(tool_calls)}


def missing_model_body(server: Literal["ollama", "vllm"], model: str) -> dict[str, Any]:
    """What Ollama and vLLM answer (404) at /v1 for a model they do not have: Ollama's
    OpenAI-compatible error, and vLLM's flat error object (`{"object": "error", ...}`)."""
    if server == "ollama":
        return {
            "error": {
                "message": f'model "{model}" not found, try pulling it first',
                "type": "not_found_error",
                "param": None,
                "code": None,
            }
        }
    return {
        "object": "error",
        "message": f"The model `{model}` does not exist.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


def _forced_tool(body: dict[str, Any]) -> str | None:
    """The tool a request makes the model call (``tool_choice`` "required": the first one
    offered, or the one it names), as a server that honours tool_choice does."""
    choice, tools = body.get("tool_choice"), body.get("tools") or []
    if isinstance(choice, dict):
        return str((choice.get("function") or {}).get("name") or "") or None
    if choice == "required" and tools:
        return str(tools[0]["function"]["name"])
    return None


async def _ollama_not_found(request: web.Request) -> web.Response:
    """What Ollama's router (gin) answers outside its routes, e.g. `/chat/completions`
    without `/v1`."""
    return web.Response(status=404, text="404 page not found")


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


@dataclass
class FakeOpenAI:
    """State of the fake: how it replies, what it was asked, and failures to serve first.

    Chat replies come from ``replies[model]`` (a queue, first in first out), else from
    ``responder(body)``, else ``default_reply``; they stream word by word.

    Topic requests (`is_topic_request`) are answered like any chat request but left out of
    `turn_requests` and of the counts of chats in flight and abandoned: those tell what the
    turns asked, which a topic written in the background must not change.

    A request that offers ``tools`` is answered from ``tool_replies`` (first in first out),
    else by ``tool_responder(body)``, else with a call of the tool ``tool_choice`` forces
    ("required" or a named one), else like any other: each is an assistant message in
    OpenAI's wire format, ``{"content": ..., "tool_calls": [tool_call(...), ...]}`` (see
    `calls`); `tool_results` tells what came back for each call in the requests after it.

    ``server`` makes the chat route speak like another OpenAI-compatible server, from its
    documented wire format: its error bodies, its stream's chunks (llama.cpp and Ollama leave
    ``usage`` out but in the last chunk, whose ``choices`` are empty; llama.cpp adds
    ``timings``), and what it does with tools. Without ``tools_supported``, llama.cpp drops
    ``tools`` silently (a chat template without them: the reply is text), vLLM refuses
    ``tool_choice`` "auto" (started without a tool parser) and Ollama refuses any. llama.cpp
    writes several tool calls unless ``parallel_tool_calls`` is false, and answers calls cut by
    ``max_tokens`` (counted in words) with a 500. Ollama answers only under ``/v1``. The strict
    server refuses fields it does not know (`STRICT_FIELDS`) with a 400 naming them.
    ``reasoning`` is streamed before the answer in ``reasoning_content`` deltas (Ollama:
    ``reasoning``), as servers with a reasoning parser do.

    Transcripts come from ``transcripts[audio_key(audio)]``, else ``transcriber(audio)``,
    else ``default_transcript``; `transcription_requests` tells what was uploaded.
    """

    dimension: int = 64
    # Every request: {"path", "body", "auth"}; `chat_requests` gives just the chat bodies.
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Statuses the embeddings route answers before succeeding, e.g. [500, 429].
    failures: list[int] = field(default_factory=list)
    # The same for the chat route, with `error_message` as the error's text.
    chat_failures: list[int] = field(default_factory=list)
    # While set, every chat request is answered with this status (an outage); None: healthy.
    chat_down_with: int | None = None
    # Chat requests for these models are answered with the status given (one model down).
    models_down: dict[str, int] = field(default_factory=dict)
    error_message: str = "The server had an error while processing your request."
    replies: dict[str, list[str]] = field(default_factory=dict)
    responder: Responder | None = None
    default_reply: str = "I am a fake model and this is my reply."
    tool_replies: list[dict[str, Any]] = field(default_factory=list)
    tool_responder: ToolResponder | None = None
    first_token_delay: float = 0.0  # seconds before the first content delta
    token_delay: float = 0.0  # seconds between content deltas
    hang: bool = False  # chat requests are never answered (not even headers)
    break_after: int | None = None  # drop the connection after this many content deltas
    streams_started: int = 0
    streams_completed: int = 0  # streams that reached `data: [DONE]`
    # Chat requests of turns (not topic ones) the client abandoned before the end.
    disconnects: int = 0
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    chats_in_flight: int = 0  # chat requests of turns (not topic ones) being answered now
    most_chats_in_flight: int = 0  # the most there ever were at once
    transcripts: dict[str, str] = field(default_factory=dict)
    transcriber: Transcriber | None = None
    default_transcript: str = "This is what the fake heard."
    # Statuses the transcription route answers before succeeding, e.g. [500] or [401].
    transcription_failures: list[int] = field(default_factory=list)
    transcription_delay: float = 0.0  # seconds before a transcript is answered
    # The server the chat route speaks like (see above); "openai": OpenAI's own API.
    server: Server = "openai"
    # Whether the model takes tools; what a server does when not depends on the server.
    tools_supported: bool = True
    # A reasoning model's thinking, streamed before its answer; None: it writes none.
    reasoning: str | None = None
    # Seconds a streamed chat reply's response headers are held back: a server that queues
    # the request until a slot is free (llama.cpp with all slots busy) before it begins.
    headers_delay: float = 0.0
    # What `GET /v1/models` lists; None: the server has no model list (404 there).
    model_list: list[str] | None = None
    # Set: a chat or embeddings request for a model `model_list` does not have is answered
    # 404 with that server's error body (`missing_model_body`); None: any name is answered.
    missing_models: Literal["ollama", "vllm"] | None = None

    def app(self) -> web.Application:
        # Room for OpenAI's own upload limit, so the fake answers 413 where OpenAI would.
        app = web.Application(client_max_size=MAX_AUDIO_BYTES + 1024 * 1024)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/audio/transcriptions", self._transcription)
        app.router.add_get("/v1/models", self._models)
        if self.server == "ollama":
            # Ollama's OpenAI-compatible API is under /v1 only; elsewhere its router says 404.
            app.router.add_route("*", "/{path:.*}", _ollama_not_found)
        return app

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The bodies of the chat requests, in order: model, messages, temperature, ..."""
        return [r["body"] for r in self.requests if r["path"] == "/v1/chat/completions"]

    @property
    def turn_requests(self) -> list[dict[str, Any]]:
        """The chat bodies the turns sent (rewrites and answers), in order: every chat
        request but the topic ones (`is_topic_request`)."""
        return [body for body in self.chat_requests if not is_topic_request(body)]

    @property
    def tool_results(self) -> dict[str, str]:
        """What the client sent back for each tool call: the call's id -> the tool message's
        content, from every chat request so far."""
        return {
            str(message.get("tool_call_id")): str(message.get("content"))
            for body in self.chat_requests
            for message in body["messages"]
            if isinstance(message, dict) and message.get("role") == "tool"
        }

    @property
    def transcription_requests(self) -> list[dict[str, Any]]:
        """What each transcription request sent, in order: ``model``, ``filename``,
        ``content_type`` and ``size`` of the file, its ``sha256`` (`audio_key`), and any
        other form fields as sent (``language``, ``response_format``, ...)."""
        return [r["body"] for r in self.requests if r["path"] == "/v1/audio/transcriptions"]

    def _record(self, request: web.Request, body: dict[str, Any]) -> None:
        self.requests.append(
            {"path": request.path, "body": body, "auth": request.headers.get("Authorization")}
        )

    def _missing(self, model: object) -> web.Response | None:
        """The 404 for a model this server does not have (`missing_models`), else None."""
        if self.missing_models is None:
            return None
        listed = self.model_list or []
        # Ollama takes a name without its tag as the ``latest`` one.
        if model in listed or f"{model}:latest" in listed:
            return None
        return web.json_response(missing_model_body(self.missing_models, str(model)), status=404)

    async def _models(self, request: web.Request) -> web.Response:
        self._record(request, {})
        if self.model_list is None:
            return web.json_response({"error": "404 page not found"}, status=404)
        data = [
            {"id": name, "object": "model", "created": 1_700_000_000, "owned_by": "library"}
            for name in self.model_list
        ]
        return web.json_response({"object": "list", "data": data})

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        if (missing := self._missing(body.get("model"))) is not None:
            return missing
        if self.failures:
            return _error(self.failures.pop(0), "try again")
        inputs = body["input"]
        if isinstance(inputs, str):
            inputs = [inputs]
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector(text, self.dimension)}
            for i, text in enumerate(inputs)
        ]
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
            }
        )

    # -- transcriptions -------------------------------------------------------------------

    async def _transcription(self, request: web.Request) -> web.Response:
        # multipart/form-data: the audio in `file` (its name tells the format) and `model`.
        if request.content_type != "multipart/form-data":
            return _error(400, "Expected a multipart/form-data request body.")
        form = await request.post()
        upload = form.get("file")
        body: dict[str, Any] = {
            name: value for name, value in form.items() if isinstance(value, str)
        }
        audio = b""
        if isinstance(upload, web.FileField):
            with upload.file:
                audio = upload.file.read()
            body.update(
                filename=upload.filename,
                content_type=upload.content_type,
                size=len(audio),
                sha256=audio_key(audio),
            )
        self._record(request, body)
        if self.transcription_failures:
            return _error(self.transcription_failures.pop(0), self.error_message)
        if not body.get("model"):
            return _error(400, "you must provide a model parameter")
        if not isinstance(upload, web.FileField):
            return _error(400, "Could not parse multipart form: the file is missing.")
        if upload.filename.rsplit(".", 1)[-1].lower() not in AUDIO_FORMATS or not audio:
            return _error(400, f"Invalid file format. Supported formats: {list(AUDIO_FORMATS)}")
        if self.transcription_delay and not await self._wait(request, self.transcription_delay):
            return web.Response(status=499)  # nobody is listening any more
        key = audio_key(audio)
        if key in self.transcripts:
            text = self.transcripts[key]
        elif self.transcriber is not None:
            text = self.transcriber(audio)
        else:
            text = self.default_transcript
        response_format = body.get("response_format", "json")
        if response_format == "text":
            return web.Response(text=text + "\n", content_type="text/plain")
        if response_format != "json":
            return _error(400, f"response_format {response_format!r}: this fake knows json, text")
        return web.json_response({"text": text})

    # -- chat ---------------------------------------------------------------------------

    def _reply_for(self, body: dict[str, Any]) -> str | dict[str, Any]:
        if body.get("tools"):
            if self.tool_replies:
                return self.tool_replies.pop(0)
            if self.tool_responder is not None:
                return self.tool_responder(body)
            forced = _forced_tool(body)
            if forced is not None:
                return calls(tool_call(forced, {}))
        queue = self.replies.get(body.get("model", ""))
        if queue:
            return queue.pop(0)
        if self.responder is not None:
            return self.responder(body)
        return self.default_reply

    async def _wait(self, request: web.Request, seconds: float) -> bool:
        """Sleep ``seconds`` (forever when infinite); False as soon as the client has gone."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if _client_gone(request):
                return False
            await asyncio.sleep(min(_POLL, max(0.0, deadline - time.monotonic())))
        return not _client_gone(request)

    def _gone(self, body: dict[str, Any]) -> None:
        if not is_topic_request(body):
            self.disconnects += 1
            self.disconnected.set()

    # -- other servers (`server`) ------------------------------------------------------------

    def _server_error(self, status: int, message: str) -> web.Response:
        """An error as `server` writes it."""
        body: dict[str, Any]
        if self.server == "llama.cpp":
            kind = _LLAMA_CPP_ERROR_TYPES.get(status, "server_error")
            body = {"error": {"code": status, "message": message, "type": kind}}
        elif self.server == "ollama":
            kind = _OLLAMA_ERROR_TYPES.get(status, "api_error")
            body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        elif self.server == "vllm":
            kind = _VLLM_ERROR_TYPES.get(status, "BadRequestError")
            body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
        elif self.server == "strict":
            kind = _VLLM_ERROR_TYPES.get(status, "BadRequestError")
            body = {"object": "error", "message": message, "type": kind, "param": None,
                    "code": status}  # fmt: skip
        else:
            return _error(status, message)
        return web.json_response(body, status=status)

    def _refusal(self, body: dict[str, Any]) -> web.Response | None:
        """The 400 `server` answers a chat request with before any model reads it, if any."""
        if self.server == "strict":
            unknown = [name for name in body if name not in STRICT_FIELDS]
            if unknown:
                details = [
                    {"type": "extra_forbidden", "loc": ("body", name),
                     "msg": "Extra inputs are not permitted", "input": body[name]}
                    for name in unknown
                ]  # fmt: skip
                return self._server_error(400, str(details))
        if not body.get("tools") or self.tools_supported:
            return None
        if self.server == "vllm" and body.get("tool_choice", "auto") == "auto":
            return self._server_error(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                "to be set",
            )
        if self.server == "ollama":
            model = str(body["model"])
            name = model if ":" in model else f"{model}:latest"
            return self._server_error(
                400, f"registry.ollama.ai/library/{name} does not support tools"
            )
        return None

    def _heard(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request as the model reads it: llama.cpp leaves the tools out of the prompt of
        a model whose chat template has none, without a word, and the model answers in text."""
        if self.server == "llama.cpp" and not self.tools_supported:
            dropped = ("tools", "tool_choice", "parallel_tool_calls")
            return {key: value for key, value in body.items() if key not in dropped}
        return body

    def _written(
        self, body: dict[str, Any], reply: str | dict[str, Any]
    ) -> str | dict[str, Any] | web.Response:
        """The reply as llama.cpp writes it: one tool call when ``parallel_tool_calls`` is
        false (else all), and a 500 when ``max_tokens`` (in words here) ends the reply within
        a call's arguments, which then do not parse."""
        if self.server != "llama.cpp" or not isinstance(reply, dict):
            return reply
        written = list(reply.get("tool_calls") or ())
        if body.get("parallel_tool_calls") is False:
            written = written[:1]
        budget = body.get("max_tokens")
        for call in written:
            arguments = str(call["function"]["arguments"])
            pieces = split_deltas(arguments)
            if isinstance(budget, int):
                budget -= 2  # the call's name and markup
                if len(pieces) > budget:
                    read = "".join(pieces[: max(0, budget)])
                    last = read[read.rfind('"') :] if '"' in read else read
                    return self._server_error(
                        500,
                        "Failed to parse tool call arguments as JSON: "
                        "[json.exception.parse_error.101] parse error at line 1, column "
                        f"{len(read) + 1}: syntax error while parsing value - invalid string: "
                        f"missing closing quote; last read: '{last}'",
                    )
                budget -= len(pieces)
        return {**reply, "tool_calls": written} if written else reply

    @property
    def _reasoning_field(self) -> str:
        return "reasoning" if self.server == "ollama" else "reasoning_content"

    def _chunk_as_written(self, data: dict[str, Any]) -> dict[str, Any]:
        """A stream chunk as `server` writes it."""
        if self.server in ("llama.cpp", "ollama") and data.get("usage") is None:
            data = {key: value for key, value in data.items() if key != "usage"}
        if self.server == "llama.cpp":
            data["system_fingerprint"] = "b6500-fake"
            if "usage" in data:
                data["timings"] = {"prompt_n": data["usage"]["prompt_tokens"],
                                   "predicted_n": data["usage"]["completion_tokens"],
                                   "prompt_ms": 12.5, "predicted_ms": 80.0}  # fmt: skip
        elif self.server == "ollama":
            data["system_fingerprint"] = "fp_ollama"
        return data

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self._record(request, body)
        counted = not is_topic_request(body)
        if counted:
            self.chats_in_flight += 1
            self.most_chats_in_flight = max(self.most_chats_in_flight, self.chats_in_flight)
        try:
            return await self._answer(request, body)
        except asyncio.CancelledError:
            # aiohttp's test server cancels the handler when the client disconnects.
            self._gone(body)
            raise
        finally:
            if counted:
                self.chats_in_flight -= 1

    async def _answer(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if (missing := self._missing(body.get("model"))) is not None:
            return missing
        if self.chat_failures:
            return _error(self.chat_failures.pop(0), self.error_message)
        if self.chat_down_with is not None:
            return _error(self.chat_down_with, self.error_message)
        if body.get("model") in self.models_down:
            return _error(self.models_down[body["model"]], self.error_message)
        if not body.get("model") or not isinstance(body.get("messages"), list):
            return _error(400, "model and messages are required")
        refused = self._refusal(body)
        if refused is not None:
            return refused
        if self.hang:
            await self._wait(request, float("inf"))
            self._gone(body)
            return web.Response(status=499)  # nobody is listening any more
        reply = self._written(body, self._reply_for(self._heard(body)))
        if isinstance(reply, web.Response):
            return reply
        if body.get("stream"):
            text = reply if isinstance(reply, str) else str(reply.get("content") or "")
            return await self._stream(request, body, text)
        if not await self._wait(request, self.first_token_delay):
            self._gone(body)
            return web.Response(status=499)  # nobody is listening any more
        return web.json_response(self._completion(body, reply))

    def _usage(self, body: dict[str, Any], reply: str | dict[str, Any]) -> dict[str, int]:
        prompt = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        completion = len(split_deltas(reply if isinstance(reply, str) else json.dumps(reply)))
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _completion(self, body: dict[str, Any], reply: str | dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply, "refusal": None}
        if isinstance(reply, dict):
            message = {"role": "assistant", "content": reply.get("content"), "refusal": None}
            if reply.get("tool_calls"):
                message["tool_calls"] = reply["tool_calls"]
        if self.reasoning is not None:
            message[self._reasoning_field] = self.reasoning
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": self._usage(body, reply),
        }

    async def _stream(
        self, request: web.Request, body: dict[str, Any], reply: str
    ) -> web.StreamResponse:
        self.streams_started += 1
        if self.headers_delay and not await self._wait(request, self.headers_delay):
            self._gone(body)
            return web.Response(status=499)  # nobody is listening any more
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        chunk_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())

        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            data = {
                "id": chunk_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": body["model"],
                "choices": choices,
                "usage": usage,
            }
            data = self._chunk_as_written(data)
            return f"data: {json.dumps(data)}\n\n".encode()

        def choice(delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

        try:
            await response.write(chunk(choice({"role": "assistant", "content": ""})))
            for piece in split_deltas(self.reasoning or ""):
                await response.write(chunk(choice({self._reasoning_field: piece})))
            for number, delta in enumerate(split_deltas(reply)):
                delay = self.first_token_delay if number == 0 else self.token_delay
                if number == self.break_after or not await self._wait(request, delay):
                    break
                await response.write(chunk(choice({"content": delta})))
            else:
                await response.write(chunk(choice({}, "stop")))
                if (body.get("stream_options") or {}).get("include_usage"):
                    await response.write(chunk([], self._usage(body, reply)))
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                self.streams_completed += 1
                return response
        except (ConnectionResetError, ConnectionError):
            pass
        if self.break_after is not None and not _client_gone(request):
            # Simulate a dropped upstream connection mid-stream.
            if request.transport is not None:
                request.transport.close()
        else:
            self._gone(body)
        return response
