"""The OpenAI-compatible API as configured, and what its failures mean, for every model there."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import openai

from core.settings import Settings

# Worth one more try: APITimeoutError is an APIConnectionError.
TRANSIENT_ERRORS = (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)
# What a call can fail with: the client's errors, our deadlines, and malformed replies
# (JSON or schema errors are ValueErrors).
FAILURES = (openai.OpenAIError, TimeoutError, ValueError)

# Answers that a later try of the same request may not get: rate limits, overload, a lock.
_RETRYABLE_STATUSES = frozenset({408, 409, 429})
# What servers say when the model or the server takes no tools: vLLM started without a tool
# parser ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be
# set'), llama.cpp without --jinja ("tools param requires --jinja flag", "Unsupported param:
# tool_choice"), Ollama for a model without tool support ("... does not support tools"),
# OpenRouter ("No endpoints found that support tool use").
_NO_TOOLS = re.compile(
    r"tool choice requires|tools param requires|unsupported param: tool|does not support tools"
    r"|support tool use"
    r"|tool(?:s|_choice| calling| calls)? (?:are |is )?(?:not supported|unsupported)",
    re.IGNORECASE,
)
# How a strict server refuses a field it does not know (pydantic's "Extra inputs are not
# permitted", OpenAI's "Unrecognized request argument supplied", "unknown field", ...).
_UNKNOWN_FIELD = re.compile(
    r"extra|unrecognized|unknown|not permitted|not allowed|unsupported|not supported"
    r"|additional propert|unexpected",
    re.IGNORECASE,
)
_NO_MODEL = re.compile(r"model.*(?:not found|does not exist|not exist)", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the models are and the key they want (a placeholder when the server needs none)."""

    api_key: str
    base_url: str | None

    @property
    def host(self) -> str:
        """For logs: the host only, never the key."""
        return (urlsplit(self.base_url).hostname or "?") if self.base_url else "default"


def configured_endpoint(settings: Settings) -> Endpoint | None:
    """The API of PARLEY_LLM_BASE_URL / PARLEY_LLM_API_KEY, or None when neither is set."""
    if not settings.llm_configured:
        return None
    api_key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else "unused"
    return Endpoint(api_key=api_key, base_url=settings.llm_base_url)


def open_client(*, api_key: str, base_url: str | None, timeout: float) -> openai.AsyncOpenAI:
    """A client that never retries on its own: its callers decide about retries and
    deadlines, so a request is never silently sent three times."""
    return openai.AsyncOpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout)


def failure_reason(exc: BaseException) -> str:
    """A short, safe description: never the server's text, which may echo the request."""
    if isinstance(exc, TimeoutError | openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIStatusError):
        return f"status {exc.status_code}"
    if isinstance(exc, openai.APIConnectionError):
        return "connection failed"
    return type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    """Whether the same request may work later: a 5xx, 408, 409 or 429 answer, a timeout, a
    failed connection, a malformed reply may; any other 4xx (a bad request, a wrong key or
    model name, no access) will not until the request or the account changes."""
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in _RETRYABLE_STATUSES
    return True


def _said(exc: BaseException | None) -> str | None:
    """What the server answered a refused request with (its status line and body), to be read
    here only: never logged or shown, as it may echo the request."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    return f"{exc.message} {exc.body}"


def refuses_tools(exc: BaseException | None) -> bool:
    """Whether an answer says the server, or the model there, takes no tools."""
    said = _said(exc)
    return said is not None and _NO_TOOLS.search(said) is not None


def refuses_field(exc: BaseException | None, name: str) -> bool:
    """Whether a 400 (or 422) says the server does not know the request field ``name``: a strict
    server's answer to a field that OpenAI's API has and it has not (``stream_options``,
    ``parallel_tool_calls``)."""
    said = _said(exc)
    refusals = (openai.BadRequestError, openai.UnprocessableEntityError)
    if said is None or not isinstance(exc, refusals):
        return False
    return name in said and _UNKNOWN_FIELD.search(said) is not None


def model_missing(exc: BaseException | None) -> bool:
    """Whether a 404 says the server has no model of the name asked for (Ollama: 'model "x"
    not found, try pulling it first'; vLLM and OpenAI: "The model `x` does not exist")."""
    said = _said(exc)
    if said is None or not isinstance(exc, openai.NotFoundError):
        return False
    return _NO_MODEL.search(said) is not None or "model_not_found" in said
