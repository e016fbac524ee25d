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
from typing import Any

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
    else by ``tool_responder(body)``, else like any other: each is an assistant message in
    OpenAI's wire format, ``{"content": ..., "tool_calls": [tool_call(...), ...]}`` (see
    `calls`); `tool_results` tells what came back for each call in the requests after it.

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

    def app(self) -> web.Application:
        # Room for OpenAI's own upload limit, so the fake answers 413 where OpenAI would.
        app = web.Application(client_max_size=MAX_AUDIO_BYTES + 1024 * 1024)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/audio/transcriptions", self._transcription)
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

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
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
        if self.chat_failures:
            return _error(self.chat_failures.pop(0), self.error_message)
        if self.chat_down_with is not None:
            return _error(self.chat_down_with, self.error_message)
        if body.get("model") in self.models_down:
            return _error(self.models_down[body["model"]], self.error_message)
        if not body.get("model") or not isinstance(body.get("messages"), list):
            return _error(400, "model and messages are required")
        if self.hang:
            await self._wait(request, float("inf"))
            self._gone(body)
            return web.Response(status=499)  # nobody is listening any more
        reply = self._reply_for(body)
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
            return f"data: {json.dumps(data)}\n\n".encode()

        def choice(delta: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

        try:
            await response.write(chunk(choice({"role": "assistant", "content": ""})))
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
