"""The chat model: any OpenAI-compatible `/chat/completions` endpoint, streamed or with tool
calls, with deadlines."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

from openai import AsyncStream
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from core.errors import ModelFailed, ToolsUnsupported
from core.llm.openai_client import (
    FAILURES,
    TRANSIENT_ERRORS,
    configured_endpoint,
    failure_reason,
    is_transient,
    model_missing,
    open_client,
    refuses_field,
    refuses_tools,
)
from core.llm.reasoning import Thoughts, without_thoughts
from core.ports import ChatChunk, ChatMessage, ChatModel, ChatReply, Tool, ToolCall, Usage
from core.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long what a server showed of a model's tools (it calls them, or it takes none) is
# believed: a server restarted with tools switched on is found within this many seconds.
TOOL_SUPPORT_SECONDS = 600.0

# The settings' defaults (PARLEY_LLM_QUEUE_TIMEOUT_SECONDS, ..._FIRST_TOKEN_..., ..._ANSWER_...).
DEFAULT_QUEUE_TIMEOUT = 20.0
DEFAULT_FIRST_TOKEN_TIMEOUT = 20.0
DEFAULT_TOTAL_TIMEOUT = 90.0


def _wire(messages: Sequence[ChatMessage]) -> list[ChatCompletionMessageParam]:
    wire: list[ChatCompletionMessageParam] = []
    for message in messages:
        if message.role == "system":
            wire.append({"role": "system", "content": message.content})
        elif message.role == "user":
            wire.append({"role": "user", "content": message.content})
        elif message.role == "tool":
            wire.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id or "",
                    "content": message.content,
                }
            )
        elif message.tool_calls:
            wire.append(
                {
                    "role": "assistant",
                    "content": message.content or None,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        }
                        for call in message.tool_calls
                    ],
                }
            )
        else:
            wire.append({"role": "assistant", "content": message.content})
    return wire


def _wire_tool(tool: Tool) -> ChatCompletionToolParam:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": dict(tool.parameters),
        },
    }


def _piece(chunk: object) -> tuple[str, str | None, Usage | None, bool]:
    """(text, finish reason, usage, whether it carries thinking) of one streamed chunk, read
    as the JSON it is; a chunk of another shape is a ValueError (a malformed reply). Thinking
    sent apart (`reasoning_content`, or `reasoning`) is never text."""
    unknown = ValueError("the model streamed a chunk of an unknown shape")
    if not isinstance(chunk, dict):
        raise unknown
    try:
        usage = chunk.get("usage")
        counted = (
            Usage(int(usage["prompt_tokens"]), int(usage["completion_tokens"])) if usage else None
        )
        choices = chunk.get("choices")
        first = choices[0] if choices else {}
        delta = first.get("delta") or {}
        text = delta.get("content") or ""
        thinking = bool(delta.get("reasoning_content") or delta.get("reasoning"))
        finish = first.get("finish_reason")
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        raise unknown from None
    if not isinstance(text, str) or not isinstance(finish, str | None):
        raise unknown
    return text, finish, counted, thinking


class OpenAIChatModel:
    """Streams replies from an OpenAI-compatible API; every failure is `ModelFailed`, which
    says whether trying again later may work.

    A streamed reply has three deadlines: ``queue_timeout`` until the server begins its
    response (connecting, a server queueing the request for a free slot, one quick retry of
    a transient failure), ``first_token_timeout`` from that moment until the first piece of
    text, so that time spent waiting in a queue is not held against the model's reading of
    the prompt, and ``total_timeout`` from the request until the whole reply is in.
    A consumer that stops early must ``aclose()`` the stream so the HTTP response closes.
    """

    tool_support_seconds = TOOL_SUPPORT_SECONDS

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None = None,
        first_token_timeout: float = DEFAULT_FIRST_TOKEN_TIMEOUT,
        total_timeout: float = DEFAULT_TOTAL_TIMEOUT,
        queue_timeout: float = DEFAULT_QUEUE_TIMEOUT,
        attempts: int = 2,
        backoff: float = 0.25,
    ) -> None:
        self._model = model
        self._queue_timeout = queue_timeout
        self._first_token_timeout = first_token_timeout
        self._total_timeout = total_timeout
        self._attempts = attempts
        self._backoff = backoff
        self._client = open_client(api_key=api_key, base_url=base_url, timeout=total_timeout)
        # Per model: whether its server calls tools, and until when that is believed.
        self._tool_support: dict[str, tuple[bool, float]] = {}
        # Per model: the optional request fields its server refused by name (a strict server
        # without `stream_options` or `parallel_tool_calls`); they are no longer sent.
        self._refused: dict[str, set[str]] = {}

    @property
    def model(self) -> str:
        return self._model

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(TRANSIENT_ERRORS),
            wait=wait_exponential(multiplier=self._backoff, max=2) + wait_random(0, self._backoff),
            stop=stop_after_attempt(self._attempts),
            reraise=True,
        ):
            with attempt:
                return await call()
        raise AssertionError("unreachable: tenacity reraises the last error")

    def _timed_out(self, model: str, limit: str, what: str, seconds: float) -> ModelFailed:
        """A streamed reply past one of its deadlines, named with its limit (transient: a
        busy server may well answer a later try)."""
        log.warning(
            "llm.stream.failed model=%s reason=timeout limit=%s transient=True", model, limit
        )
        return ModelFailed(
            f"language model failed: timeout: {what} within {seconds:g} s ({limit} limit)",
            transient=True,
        )

    def _failed(self, what: str, model: str, exc: BaseException) -> ModelFailed:
        reason, transient = failure_reason(exc), is_transient(exc)
        if model_missing(exc):  # a name misspelt, or a model not pulled (Ollama)
            reason = f"{reason}, the server has no model {model!r}"
        log.warning("llm.%s.failed model=%s reason=%s transient=%s", what, model, reason, transient)
        return ModelFailed(f"language model failed: {reason}", transient=transient)

    async def _without_refused(
        self,
        name: str,
        body: dict[str, Any],
        optional: Sequence[str],
        send: Callable[[dict[str, Any]], Awaitable[T]],
    ) -> T:
        """``send(body)``. A strict server that refuses one of the ``optional`` fields by name
        is asked once more without it; once that try is answered, the field is left out of
        this model's requests from then on."""
        refused = self._refused.setdefault(name, set())
        body = {key: value for key, value in body.items() if key not in refused}
        try:
            return await send(body)
        except FAILURES as exc:
            field = next((f for f in optional if f in body and refuses_field(exc, f)), None)
            if field is None:
                raise
            log.info("llm.field.refused model=%s field=%s", name, field)
            result = await send({key: value for key, value in body.items() if key != field})
            refused.add(field)
            return result

    def _tools_known(self, name: str) -> bool | None:
        """Whether the server calls tools for model ``name``; None while that is not known."""
        known = self._tool_support.get(name)
        return known[0] if known is not None and time.monotonic() < known[1] else None

    def _remember_tools(self, name: str, supported: bool) -> None:
        self._tool_support[name] = (supported, time.monotonic() + self.tool_support_seconds)

    def _no_tools(self, name: str, why: str) -> ToolsUnsupported:
        self._remember_tools(name, False)
        log.warning("llm.tools.unsupported model=%s why=%s", name, why)
        return ToolsUnsupported(f"language model {name!r} takes no tools on this server: {why}")

    async def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        temperature: float,
        model: str | None = None,
    ) -> AsyncIterator[ChatChunk]:
        name = model or self._model
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self._total_timeout
        queue_deadline = min(deadline, started + self._queue_timeout)
        try:
            async with asyncio.timeout_at(queue_deadline):
                # The chunks are read as plain JSON: the client's typed chunk objects cost
                # the event loop about 150 us per token, which with 50 answers streaming at
                # once was a third of a core spent on objects read for one string. The
                # client still sends, decodes the stream and raises its errors.
                # A strict server that knows no `stream_options` is asked again without:
                # the reply then may come without its usage.
                response = await self._without_refused(
                    name,
                    {
                        "model": name,
                        "messages": _wire(messages),
                        "max_tokens": max_tokens,
                        "temperature": temperature,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    },
                    ("stream_options",),
                    lambda body: self._retrying(
                        lambda: self._client.post(
                            "/chat/completions",
                            body=body,
                            cast_to=object,
                            stream=True,
                            stream_cls=AsyncStream[object],
                        )
                    ),
                )
        except TimeoutError as exc:
            if loop.time() >= deadline:
                raise self._timed_out(name, "total", "no reply", self._total_timeout) from exc
            raise self._timed_out(
                name, "queue", "the server did not begin its response", self._queue_timeout
            ) from exc
        except FAILURES as exc:
            raise self._failed("stream", name, exc) from exc
        # The response has begun: the server is at work on this request now, whatever it
        # was waiting for before, so the first token's time counts from here.
        begun = loop.time()
        first_deadline = min(deadline, begun + self._first_token_timeout)
        usage: Usage | None = None
        # A reasoning model's thinking (in `reasoning_content` or in <think> blocks) never
        # leaves as text; it shows the model at work, so the first token's deadline is met.
        thoughts = Thoughts()
        seen_text = False
        # Leaving this block in any way (end, error, cancellation, aclose) closes the
        # HTTP response, so an abandoned reply stops costing tokens at once.
        async with response:
            while True:
                try:
                    async with asyncio.timeout_at(deadline if seen_text else first_deadline):
                        chunk = await anext(response)
                    text, finish, counted, thinking = _piece(chunk)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    if seen_text or loop.time() >= deadline:
                        raise self._timed_out(
                            name, "total", "the reply was not finished", self._total_timeout
                        ) from exc
                    raise self._timed_out(
                        name,
                        "first_token",
                        "no text after the response began",
                        self._first_token_timeout,
                    ) from exc
                except FAILURES as exc:
                    raise self._failed("stream", name, exc) from exc
                except asyncio.CancelledError:
                    log.info("llm.stream.cancelled model=%s", name)
                    raise
                usage = counted or usage
                if thinking:
                    thoughts.thought()
                    seen_text = True
                if text:
                    seen_text = True
                    visible = thoughts.feed(text)
                    if visible:
                        yield ChatChunk(text=visible)
                if finish not in (None, "stop"):
                    log.info("llm.stream.cut model=%s reason=%s", name, finish)
        rest = thoughts.end()
        if rest:
            yield ChatChunk(text=rest)
        log.debug("llm.stream.done model=%s seconds=%.2f", name, loop.time() - started)
        if usage is not None or thoughts.seconds is not None:
            yield ChatChunk(usage=usage, thought_seconds=thoughts.seconds)

    async def _create(
        self,
        what: str,
        name: str,
        timeout: float | None,  # noqa: ASYNC109 - the request's own deadline
        optional: Sequence[str] = (),
        **request: Any,
    ) -> ChatCompletion:
        """One whole (not streamed) completion with retries within ``timeout``, asked once
        more without an ``optional`` field a strict server refuses; every failure, and a reply
        without choices, is `ModelFailed`."""
        try:
            async with asyncio.timeout(timeout if timeout is not None else self._total_timeout):
                completion: ChatCompletion = await self._without_refused(
                    name,
                    request,
                    optional,
                    lambda body: self._retrying(
                        lambda: self._client.chat.completions.create(model=name, **body)
                    ),
                )
        except FAILURES as exc:
            raise self._failed(what, name, exc) from exc
        if not completion.choices:
            raise self._failed(what, name, ValueError("no choices"))
        return completion

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        temperature: float,
        model: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the ChatModel port asks for it
    ) -> str:
        completion = await self._create(
            "complete",
            model or self._model,
            timeout,
            messages=_wire(messages),
            max_tokens=max_tokens,
            temperature=temperature,
        )
        return without_thoughts(completion.choices[0].message.content or "")

    async def respond(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Tool],
        max_tokens: int,
        temperature: float,
        tool_choice: Literal["auto", "none"] = "auto",
        model: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the ChatModel port asks for it
    ) -> ChatReply:
        """`ToolsUnsupported` when the server, or the model there, takes no tools: found at
        the model's first request with tools, and believed for `tool_support_seconds`."""
        name = model or self._model
        known = self._tools_known(name) if tools else True
        if known is False:
            raise ToolsUnsupported(f"language model {name!r} takes no tools on this server")
        # Until the server has shown that it calls tools for this model, a call is asked for
        # outright: a server that drops `tools` silently (llama.cpp, a chat template without
        # them) answers with text all the same, and so tells.
        probe = known is None and tool_choice == "auto"
        request: dict[str, Any] = {
            "messages": _wire(messages),
            "tools": [_wire_tool(t) for t in tools],
            "tool_choice": "required" if probe else tool_choice,
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if tools:
            # One call at a time: a server that allows several by default (llama.cpp) may
            # write calls until max_tokens cuts one in half, and answer that with a 500.
            request["parallel_tool_calls"] = False
        try:
            completion = await self._create(
                "respond", name, timeout, optional=("parallel_tool_calls",), **request
            )
        except ModelFailed as failed:
            if tools and refuses_tools(failed.__cause__):
                raise self._no_tools(name, "it refused them") from failed.__cause__
            raise
        message = completion.choices[0].message
        calls = tuple(
            ToolCall(call.id, call.function.name, call.function.arguments)
            for call in message.tool_calls or ()
            if call.type == "function"
        )
        if probe and not calls:
            raise self._no_tools(name, "it answered a request for a tool call with text")
        if calls:
            self._remember_tools(name, True)
        usage = completion.usage
        return ChatReply(
            without_thoughts(message.content or ""),
            calls,
            Usage(usage.prompt_tokens, usage.completion_tokens) if usage is not None else None,
        )

    async def close(self) -> None:
        await self._client.close()


def open_chat_model(settings: Settings) -> ChatModel | None:
    """The configured LLM, or None when there is none (answers are then extractive)."""
    endpoint = configured_endpoint(settings)
    if endpoint is None:
        return None
    log.info("llm.configured model=%s host=%s", settings.llm_model, endpoint.host)
    timeouts = settings.llm_timeouts
    return OpenAIChatModel(
        settings.llm_model,
        api_key=endpoint.api_key,
        base_url=endpoint.base_url,
        queue_timeout=timeouts.queue,
        first_token_timeout=timeouts.first_token,
        total_timeout=timeouts.answer,
    )


async def close_chat_model(model: ChatModel | None) -> None:
    if isinstance(model, OpenAIChatModel):
        await model.close()
