"""Short questions to a model server: does it answer, does it have the configured models, does
it embed. `parley doctor` asks them; `parley serve` keeps asking the first two (`ModelWatch`),
so a wrong model name or a server that is down is said at start and shows in /readyz rather
than only as failed turns."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import openai

from core.llm.openai_client import FAILURES, Endpoint, configured_endpoint, open_client
from core.settings import Settings

log = logging.getLogger(__name__)

# How long listing the models may take: a server that cannot say what it has in this time
# is not one a turn should wait on either.
LIST_TIMEOUT = 10.0
# The server's own words in a failure are cut to this many characters.
_MESSAGE_CHARS = 200
# Statuses of a server without a model list at /models.
_NO_LIST = frozenset({404, 405, 501})


class ServerProblem(Exception):
    """A question the server did not answer: ``message`` says why in a sentence (with the
    server's own message for a refused request, never the API key), ``status`` is the HTTP
    status of a refusal (None when there was no answer at all)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Finding:
    """One answer of a check: ``ok``, and what was found or what is wrong."""

    ok: bool
    detail: str


def listed(model: str, names: Sequence[str]) -> bool:
    """Whether ``model`` is among the ``names`` a server lists; Ollama lists ``name:tag``
    and takes a name without its tag as the ``latest`` one."""
    return model in names or (":" not in model and f"{model}:latest" in names)


def _server_message(body: object, api_key: str) -> str:
    """The message in an error body (`{"error": {"message"}}`, vLLM's flat
    `{"message"}`, or plain text), shortened, with the key taken out should it be echoed."""
    message: object = body
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message", inner) if isinstance(inner, dict) else inner
    text = " ".join(str(message or "").split())
    if api_key and api_key != "unused":
        text = text.replace(api_key, "<key>")
    return text[:_MESSAGE_CHARS]


class ModelServer:
    """One OpenAI-compatible API (PARLEY_LLM_BASE_URL, or OpenAI's), asked short questions
    within ``timeout`` seconds each; every failure is a `ServerProblem`."""

    def __init__(self, endpoint: Endpoint, *, timeout: float) -> None:
        self._endpoint = endpoint
        self._timeout = timeout
        self._client = open_client(
            api_key=endpoint.api_key, base_url=endpoint.base_url, timeout=max(timeout, 1.0)
        )

    @property
    def host(self) -> str:
        return self._endpoint.host

    def _problem(self, exc: BaseException, within: float) -> ServerProblem:
        if isinstance(exc, TimeoutError | openai.APITimeoutError):
            return ServerProblem(f"no answer from {self.host} within {within:g} s")
        if isinstance(exc, openai.APIStatusError):
            said = _server_message(exc.body, self._endpoint.api_key)
            return ServerProblem(
                f"{self.host} answered {exc.status_code}" + (f": {said}" if said else ""),
                status=exc.status_code,
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__
            why = f" ({type(cause).__name__})" if cause is not None else ""
            return ServerProblem(f"cannot connect to {self.host}{why}")
        return ServerProblem(
            f"{self.host} gave an answer that cannot be read ({type(exc).__name__})"
        )

    async def _ask(self, call: Any, within: float | None = None) -> Any:
        seconds = within if within is not None else self._timeout
        try:
            async with asyncio.timeout(seconds):
                return await call()
        except FAILURES as exc:
            raise self._problem(exc, seconds) from exc

    async def models(self) -> list[str] | None:
        """The names `GET /models` lists, or None when the server has no such list."""
        try:
            page = await self._ask(lambda: self._client.models.list(), LIST_TIMEOUT)
        except ServerProblem as problem:
            if problem.status in _NO_LIST:
                return None
            raise
        return [str(model.id) for model in page.data]

    async def answer(self, model: str) -> None:
        """A one-token completion from ``model``."""
        completion = await self._ask(
            lambda: self._client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Say OK."}],
                max_tokens=1,
                temperature=0,
            )
        )
        if not completion.choices:
            raise ServerProblem(f"{self.host} answered {model!r} without a reply")

    async def embed(self, model: str) -> int:
        """The size of ``model``'s vector for one short text."""
        result = await self._ask(
            lambda: self._client.embeddings.create(model=model, input=["parley doctor"])
        )
        if not result.data:
            raise ServerProblem(f"{self.host} answered {model!r} without a vector")
        return len(result.data[0].embedding)

    async def close(self) -> None:
        await self._client.close()


async def find_model(
    server: ModelServer, model: str, names: list[str] | None, *, spend: bool = True
) -> Finding:
    """Whether ``server`` has ``model``: among the ``names`` its `GET /models` lists (None:
    it has no list), else answering a one-token completion. Without ``spend`` no completion
    is asked for and a server that answers is taken to have it."""
    if names is not None and listed(model, names):
        return Finding(True, f"listed by {server.host}")
    if not spend:
        return Finding(True, f"{server.host} answers")
    try:
        await server.answer(model)
    except ServerProblem as problem:
        if problem.status == 404:
            shown = f"; it lists {', '.join(names[:8])}" if names else ""
            return Finding(False, f"not found: {problem.message}{shown}")
        return Finding(False, problem.message)
    if names is None:
        return Finding(True, f"answers on {server.host}, which lists no models")
    return Finding(True, f"answers on {server.host} (not in its list: it serves what it loaded)")


def open_model_server(settings: Settings) -> ModelServer | None:
    """The configured model server, asked within the time a turn waits for its first token;
    None without a model."""
    endpoint = configured_endpoint(settings)
    if endpoint is None:
        return None
    timeouts = settings.llm_timeouts
    return ModelServer(endpoint, timeout=timeouts.queue + timeouts.first_token)


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """The answer model as last checked: ``ok``, what was found or why not, and when
    (the event loop's clock)."""

    ok: bool
    detail: str
    at: float


class ModelWatch:
    """Whether the answer model is there, as of a recent check.

    `start` checks in the background (`parley serve` at start, so a slow server never holds
    the start up); `status` answers from the last check while it is younger than
    ``fresh_for`` seconds (``recheck`` for a failed one, so that a mended server shows at
    once), else checks again and waits at most ``within`` for it. A check
    lists the server's models; only a model its list leaves out is asked for a one-token
    completion, and only until it has answered once. A failure is logged when it begins,
    naming the model and the host.
    """

    def __init__(
        self, server: ModelServer, model: str, *, fresh_for: float = 30.0, recheck: float = 1.0
    ) -> None:
        self._server = server
        self._model = model
        self._fresh_for = fresh_for
        self._recheck = recheck
        self._last: ModelStatus | None = None
        self._found = False
        self._task: asyncio.Task[ModelStatus] | None = None

    @property
    def model(self) -> str:
        return self._model

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def last(self) -> ModelStatus | None:
        return self._last

    def start(self) -> asyncio.Task[ModelStatus]:
        """The check under way, or a new one."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._check(), name="model-check")
        return self._task

    async def status(self, *, within: float) -> ModelStatus | None:
        """The last check's answer when fresh, else a new one's if it comes ``within``
        seconds, else the last (None: no check has finished yet)."""
        last = self._last
        if last is not None:
            age = asyncio.get_running_loop().time() - last.at
            if age < (self._fresh_for if last.ok else self._recheck):
                return last
        task = self.start()
        try:
            return await asyncio.wait_for(asyncio.shield(task), within)
        except TimeoutError:
            return self._last

    async def _check(self) -> ModelStatus:
        try:
            names = await self._server.models()
        except ServerProblem as problem:
            finding = Finding(False, problem.message)
        else:
            # A completion only when the server's list leaves out a model not found before
            # (llama.cpp answers to any name; Ollama and vLLM answer 404): a server with few
            # slots has none to spare for checks, and one without a list says it at once.
            spend = names is not None and not self._found
            finding = await find_model(self._server, self._model, names, spend=spend)
        status = ModelStatus(finding.ok, finding.detail, asyncio.get_running_loop().time())
        before = self._last
        if not status.ok and (before is None or before.ok):
            log.warning(
                "llm.check.failed model=%s host=%s reason=%s (answers the model writes fail "
                "until it is mended)",
                self._model,
                self.host,
                status.detail,
            )
        elif status.ok and (before is None or not before.ok):
            log.info("llm.check.ok model=%s host=%s %s", self._model, self.host, status.detail)
        self._found = self._found or status.ok
        self._last = status
        return status

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._server.close()
