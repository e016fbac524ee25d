"""The OpenAI-compatible API as configured, and what its failures mean, for every model there."""

from __future__ import annotations

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
