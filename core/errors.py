"""The errors Parley raises on purpose, each with a stable machine-readable code.

The hierarchy::

    ParleyError                     anything Parley reports to a user or an operator
    ├── ConfigError                 a setting or a combination of settings is unusable
    │   ├── EmbedderMismatch        the configured embedder differs from an agent's index
    │   └── SecretUnreadable        a stored channel secret's key is not configured, or the
    │                               value was altered (core/keyring.py)
    ├── Unavailable                 a backing service cannot be reached
    │   ├── StoreUnavailable        PostgreSQL
    │   ├── CacheUnavailable        Redis (readiness reports it; requests never see it)
    │   ├── ModelFailed             the language model failed a request; ``transient`` says
    │   │   │                       whether trying again later may work
    │   │   └── ToolsUnsupported    the server, or the model there, takes no tools (it refuses
    │   │                           them, or answers as if none were offered)
    │   ├── MediaUnavailable        an inbound media file could not be downloaded
    │   │                           (core/media.py); ``reason`` says why, ``transient``
    │   │                           whether trying again later may work
    │   └── AdminDisabled           no admin token and no staff account: nobody can sign in
    ├── InvalidInput                a request or a command argument is malformed
    ├── NotFound                    something named does not exist
    │   └── AgentNotFound
    ├── Conflict                    it exists already
    │   └── SecretsKeyMissing       a channel secret to store, and no PARLEY_SECRETS_KEY to
    │                               encrypt it with (core/keyring.py)
    ├── Unauthorized                no or wrong credentials
    ├── Forbidden                   credentials fine, access refused
    └── RateLimited                 too many requests; ``retry_after`` seconds

The gateway maps each class to one HTTP status in a single middleware; the CLI prints the
message on one line and exits with status 2.
"""

from __future__ import annotations


class ParleyError(Exception):
    """Base class; ``code`` is stable and safe to show, the message is for humans."""

    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(ParleyError):
    code = "config"


class EmbedderMismatch(ConfigError):
    code = "embedder_mismatch"


class Unavailable(ParleyError):
    code = "unavailable"


class StoreUnavailable(Unavailable):
    code = "database_unavailable"


class CacheUnavailable(Unavailable):
    code = "cache_unavailable"


class ModelFailed(Unavailable):
    """The language model failed a request. ``transient`` (a 5xx, a 429, a timeout, a
    connection that failed) means the same request may work later; otherwise (a 400, 401,
    403 or 404) it never will until the request, the key or the model name changes."""

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class ToolsUnsupported(ModelFailed):
    """The server, or the model there, takes no tools: it refused them by name, or answered a
    request for a tool call with text (a chat template without tools drops them silently).
    Asking again with tools will not help until the server is set up for them."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class MediaUnavailable(Unavailable):
    """An inbound media file (a voice note, a photo) could not be downloaded.

    ``reason`` is short, stable and safe to log (never the URL, which may carry a signature):
    ``too_large`` (a Content-Length or a body above the limit), ``timeout`` (the whole
    download, redirects included, took too long), ``connection`` (no connection, or it broke
    off), ``http_<status>`` (e.g. ``http_404``), ``redirect`` (more than allowed, without a
    Location, to a scheme other than http(s), or from https down to http), ``url`` (not an
    http(s) URL to begin with), ``refused`` (the outbound guard would not connect to the
    address, first or after a redirect: not public, not on PARLEY_MEDIA_ALLOW_NETWORKS) or
    ``not_media`` (the answer is a page or data, not audio, an image or a video).
    ``transient`` (a timeout, a failed connection, a 408, 429 or 5xx answer) means the same
    download may work later; the others never will."""

    code = "media_unavailable"

    def __init__(self, reason: str, *, transient: bool) -> None:
        super().__init__(f"media unavailable: {reason}")
        self.reason = reason
        self.transient = transient


class AdminDisabled(Unavailable):
    code = "admin_disabled"


class InvalidInput(ParleyError):
    code = "invalid_input"


class NotFound(ParleyError):
    code = "not_found"


class AgentNotFound(NotFound):
    code = "agent_not_found"

    def __init__(self, slug: str) -> None:
        super().__init__(f"unknown agent {slug!r}")
        self.slug = slug


class Conflict(ParleyError):
    code = "conflict"


class Unauthorized(ParleyError):
    code = "unauthorized"


class Forbidden(ParleyError):
    code = "forbidden"


class RateLimited(ParleyError):
    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
