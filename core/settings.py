"""Parley's settings: read from the environment and a `.env` file, validated once at start."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    AliasChoices,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from core.errors import ConfigError


def _http_url(value: str) -> str:
    if not re.match(r"^https?://[^/\s]+", value):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


def _database_url(value: SecretStr) -> SecretStr:
    if not re.match(r"^postgres(ql)?://", value.get_secret_value()):
        raise ValueError("must be a postgresql:// URL")
    return value


def _redis_url(value: SecretStr) -> SecretStr:
    if not re.match(r"^(rediss?|unix)://", value.get_secret_value()):
        raise ValueError("must be a redis://, rediss:// or unix:// URL")
    return value


def _telegram_secret(value: SecretStr) -> SecretStr:
    # Telegram's own rule for setWebhook(secret_token=...), and long enough not to be guessed:
    # it is all that tells a webhook call from Telegram apart from anyone's.
    secret = value.get_secret_value()
    if not re.fullmatch(r"[A-Za-z0-9_-]*", secret):
        raise ValueError("must be made of A-Z, a-z, 0-9, _ and - only")
    if len(secret) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"must be at least {MIN_TOKEN_CHARS} characters long "
            "(make one with: openssl rand -hex 32)"
        )
    if len(secret) > 256:
        raise ValueError("must be at most 256 characters long")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]

# A bearer token that guards every conversation (or the metrics) must not be guessable.
MIN_TOKEN_CHARS = 32


def _long_token(value: SecretStr) -> SecretStr:
    if len(value.get_secret_value()) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"must be at least {MIN_TOKEN_CHARS} characters long "
            "(make one with: openssl rand -hex 32)"
        )
    return value


Token = Annotated[SecretStr, AfterValidator(_long_token)]


def _no_key_when_empty(value: Any) -> Any:
    return None if value == "" else value


def _secrets_key(value: SecretStr) -> SecretStr:
    # A Fernet key: 32 bytes in url-safe base64, as `parley secrets new-key` prints.
    try:
        raw = base64.urlsafe_b64decode(value.get_secret_value().encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raw = b""
    if len(raw) != 32:
        raise ValueError(
            "must be a key made by `parley secrets new-key` (32 url-safe base64 bytes)"
        )
    return value


def _secrets_keys(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


SecretsKey = Annotated[SecretStr, AfterValidator(_secrets_key)]


def _networks(value: Any) -> Any:
    # The environment gives "10.20.0.0/16, fd00::/8"; code may pass a list.
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, list | tuple):
        return [ip_network(part, strict=False) if isinstance(part, str) else part for part in value]
    return value


Networks = Annotated[list[IPv4Network | IPv6Network], NoDecode, BeforeValidator(_networks)]

JobName = Literal["summaries", "recrawl", "answer-checks", "retention", "outbox-sweep"]
JOB_NAMES: tuple[JobName, ...] = get_args(JobName)


def _job_schedule(value: str) -> str:
    if not re.fullmatch(r"off|every\s+[1-9]\d*\s*[smh]|([01]\d|2[0-3]):[0-5]\d", value.strip()):
        raise ValueError(f"schedule {value!r}: expected 'every 5m', 'HH:MM' or 'off'")
    return value.strip()


def _time_zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{value!r} is not an IANA time zone such as Europe/Amsterdam") from None
    return value


def _env(*names: str) -> AliasChoices:
    """Accept the environment names given, and the field name for `Settings(...)` in code."""
    return AliasChoices(*names)


class Settings(BaseSettings):
    """Every knob of a Parley deployment; see the README's table for what each one does."""

    model_config = SettingsConfigDict(
        env_prefix="PARLEY_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        populate_by_name=True,
        frozen=True,
    )

    database_url: Annotated[SecretStr, AfterValidator(_database_url)] | None = None
    redis_url: Annotated[SecretStr, AfterValidator(_redis_url)] | None = None
    # Every key Parley writes to Redis starts with this, so one server can be shared.
    redis_prefix: str = Field("parley:", pattern=r"^[A-Za-z0-9:_.-]{1,64}$")
    data_dir: Path = Path(".parley")
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    public_url: HttpUrl | None = None
    admin_token: Token | None = None
    # With a token, GET /metrics wants "Authorization: Bearer <token>"; without one it is
    # served only to clients on this machine (loopback), never through a proxy.
    metrics_token: Token | None = None
    # How long a staff console sign-in lasts before the password (or token) is asked again.
    admin_session_hours: float = Field(12.0, gt=0, le=24 * 30)
    # Proxies in front of the gateway (addresses or CIDRs, comma-separated): only a request
    # from one of them has its client address read from ``forwarded_header``, the right-most
    # hop that is not itself a trusted proxy. Empty: the connection's own address, always.
    trusted_proxies: Networks = Field(default_factory=list)
    forwarded_header: Literal["x-forwarded-for", "forwarded"] = "x-forwarded-for"
    # Slow clients: a request body must have arrived this long after its headers (else 408),
    # and an idle connection, or one whose request headers are still incomplete, is closed
    # after keepalive_seconds (since it opened or since its last response).
    body_read_seconds: float = Field(15.0, gt=0, le=300)
    keepalive_seconds: float = Field(75.0, gt=0, le=3600)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    llm_base_url: HttpUrl | None = None
    llm_api_key: SecretStr | None = Field(
        None, validation_alias=_env("PARLEY_LLM_API_KEY", "OPENAI_API_KEY", "llm_api_key")
    )
    llm_model: str = "gpt-4o-mini"
    # The model's deadlines, in seconds (README: "Timeouts"; `llm_timeouts` reads them). An
    # answer: the server must begin its response (connecting, waiting for a free slot)
    # within the queue limit, send the first word within the first-token limit counted from
    # that moment, and end within the answer limit counted from the request. Hosted models
    # are quick at each; a CPU server with few slots queues, and reads the prompt slowly.
    llm_queue_timeout_seconds: float = Field(20.0, gt=0, le=3600)
    llm_first_token_timeout_seconds: float = Field(20.0, gt=0, le=3600)
    llm_answer_timeout_seconds: float = Field(90.0, gt=0, le=3600)
    # The short calls around an answer; unset: the older *_TIMEOUT_MS settings below (whose
    # defaults are 1.5 s for the rewrite and the translation, 8 s for summary and critic).
    llm_rewrite_timeout_seconds: float | None = Field(None, gt=0, le=600)
    llm_translate_timeout_seconds: float | None = Field(None, gt=0, le=600)
    llm_summary_timeout_seconds: float | None = Field(None, gt=0, le=600)
    llm_critic_timeout_seconds: float | None = Field(None, gt=0, le=600)
    rewrite_model: str | None = None
    rewrite_timeout_ms: int = Field(1500, ge=50, le=30000)
    # Conversation summaries (core/memory): default model is the rewrite model, else the main.
    summary_model: str | None = None
    summary_timeout_ms: int = Field(8000, ge=100, le=60000)
    # The answer gates' critic (core/answer/critic.py): a second model that checks a written
    # answer against the question and its sources, within critic_timeout_ms (else the answer
    # counts as not checked). Unset: no critic.
    critic_model: str | None = None
    critic_timeout_ms: int = Field(8000, ge=100, le=60000)
    # Query translation (core/answer/translate.py): a question in a language the knowledge
    # is not written in is searched in the knowledge's language, translated by this model
    # within llm_timeouts.translate (the rewrite's unless set). Unset: searched as asked (the
    # embedder is multilingual).
    translate_model: str | None = None
    # Voice notes: the speech-to-text model at the LLM's API (e.g. whisper-1 or
    # gpt-4o-mini-transcribe; core/transcribe.py); unset: nothing is transcribed.
    transcribe_model: str | None = None
    # An inbound media file (core/media.py) larger than this, or slower than this to download
    # (redirects included), is not read. WhatsApp's own limit for audio is 16 MB.
    media_max_bytes: int = Field(16 * 1024 * 1024, ge=1, le=100 * 1024 * 1024)
    media_timeout_seconds: float = Field(20.0, gt=0, le=300)
    # Private networks media downloads may reach all the same (comma-separated CIDRs). Apart
    # from crawl_allow_networks: staff choose what is crawled, while a media URL comes with a
    # message, and no provider serves media from a private address; only a local fake or
    # proxy standing in for the provider's API (PARLEY_TWILIO_API_BASE...) needs listing.
    media_allow_networks: Networks = Field(default_factory=list)

    embed_provider: Literal["use", "openai"] = "use"
    embed_model: str | None = None
    embed_base_url: HttpUrl | None = None
    rerank_url: HttpUrl | None = None

    # Private networks the crawler may read all the same (an intranet), comma-separated
    # CIDRs; every other loopback, private, link-local or otherwise non-public address is
    # refused, since what is crawled can be read by any visitor of the widget.
    crawl_allow_networks: Networks = Field(default_factory=list)

    # Agents' channel secrets (Twilio auth token, Telegram bot token and webhook secret) are
    # stored encrypted under this key, and cannot be stored without it. Keys used before stay
    # readable while listed in PARLEY_SECRETS_OLD_KEYS (comma-separated), until `parley
    # secrets rotate` has re-encrypted everything under the current one.
    secrets_key: Annotated[SecretsKey | None, BeforeValidator(_no_key_when_empty)] = None
    secrets_old_keys: Annotated[list[SecretsKey], NoDecode, BeforeValidator(_secrets_keys)] = Field(
        default_factory=list
    )

    twilio_account_sid: str | None = Field(
        None, validation_alias=_env("TWILIO_ACCOUNT_SID", "twilio_account_sid")
    )
    twilio_auth_token: SecretStr | None = Field(
        None, validation_alias=_env("TWILIO_AUTH_TOKEN", "twilio_auth_token")
    )
    twilio_whatsapp_from: str | None = Field(
        None, validation_alias=_env("TWILIO_WHATSAPP_FROM", "twilio_whatsapp_from")
    )
    twilio_api_base: HttpUrl = "https://api.twilio.com"
    telegram_bot_token: SecretStr | None = Field(
        None, validation_alias=_env("TELEGRAM_BOT_TOKEN", "telegram_bot_token")
    )
    telegram_webhook_secret: Annotated[SecretStr, AfterValidator(_telegram_secret)] | None = Field(
        None, validation_alias=_env("TELEGRAM_WEBHOOK_SECRET", "telegram_webhook_secret")
    )
    telegram_api_base: HttpUrl = "https://api.telegram.org"
    # Seconds a send to Twilio / Telegram may take before it counts as unanswered (README:
    # "What can be lost or repeated"); below the outbox lease (60 s). Telegram's stays above
    # the 8 s its Bot API server may itself wait (flood control) before it answers.
    twilio_send_timeout_seconds: float = Field(15.0, gt=0, le=50)
    telegram_send_timeout_seconds: float = Field(30.0, gt=8, le=50)
    # WhatsApp through Meta's Cloud API (channels/meta.py), the environment's default for
    # every agent: the app secret signs webhooks (X-Hub-Signature-256), the verify token
    # answers Meta's subscription check, the access token and phone number id send.
    meta_app_secret: SecretStr | None = Field(
        None, validation_alias=_env("META_APP_SECRET", "meta_app_secret")
    )
    meta_verify_token: SecretStr | None = Field(
        None, validation_alias=_env("META_VERIFY_TOKEN", "meta_verify_token")
    )
    meta_access_token: SecretStr | None = Field(
        None, validation_alias=_env("META_ACCESS_TOKEN", "meta_access_token")
    )
    meta_phone_number_id: str | None = Field(
        None, validation_alias=_env("META_PHONE_NUMBER_ID", "meta_phone_number_id")
    )
    meta_api_base: HttpUrl = "https://graph.facebook.com"
    meta_api_version: str = Field("v21.0", pattern=r"^v[0-9]{1,3}\.[0-9]{1,3}$")
    meta_send_timeout_seconds: float = Field(15.0, gt=0, le=50)
    # WhatsApp / Telegram turns one worker process has in flight at once (`parley worker
    # --concurrency N`); most of them wait on the model, which costs them no work slot.
    worker_concurrency: int = Field(256, ge=1, le=1024)
    # Of those, how many do their own work (embedding, search, quoting, saving) at once: a
    # few, so the cores and the database pool are not shared by dozens of turns' work.
    worker_cpu_slots: int = Field(4, ge=1, le=64)
    # WhatsApp / Telegram messages of one chat this close together are answered as one turn.
    # Short, because every answer waits for it; a message that comes later, while the reply
    # is still being written, is caught by redo_when_superseded.
    burst_window_seconds: float = Field(1.0, ge=0, le=60)
    # A message arriving while its chat's reply is made: drop that reply, answer both at once.
    redo_when_superseded: bool = True
    # A WhatsApp / Telegram message whose answer keeps failing because a service is down (the
    # model, PostgreSQL, Redis) is tried again, with back-off, for this long after it came in;
    # then it is marked failed (staff can take it up again). Well inside WhatsApp's 24-hour
    # window, so the late answer can still be sent as free text.
    inbox_retry_hours: float = Field(6.0, gt=0, le=20)
    # A customer still without an answer this long after writing is told, once per turn, that
    # the answer is delayed (in their language); 0 never tells them.
    holding_message_seconds: float = Field(30.0, ge=0, le=3600)

    # Scheduled jobs (core/jobs/scheduler.py): PARLEY_JOBS=off runs none in this process.
    jobs: bool = True
    # Re-crawl at this time, retention 30 and answer checks 60 minutes later, in
    # PARLEY_JOBS_TIMEZONE (default: the server's own time zone, whatever the agents').
    nightly_at: str = Field("03:00", pattern=r"^([01]\d|2[0-3]):[0-5]\d$")
    jobs_timezone: Annotated[str, AfterValidator(_time_zone)] | None = None
    # Per-job override, JSON: {"recrawl": "04:30", "summaries": "every 2m", "retention": "off"}.
    job_schedules: dict[JobName, Annotated[str, AfterValidator(_job_schedule)]] = Field(
        default_factory=dict
    )
    # Conversations whose last message is older are deleted nightly; 0 keeps them forever.
    retention_days: int = Field(90, ge=0)

    # Staff are told (console notifications, the webhook) when a customer asks for a person,
    # or a conversation waits longer than this: a visitor message unanswered by bot or staff.
    notify_waiting_minutes: float = Field(10.0, gt=0, le=24 * 60)
    # Each such event is POSTed here as signed JSON (README: "Being told"); unset: not sent.
    notify_webhook: HttpUrl | None = None
    # Signs the webhook's events (X-Parley-Signature); required with notify_webhook.
    notify_secret: Token | None = None

    # The answer cache (core/answer/answer_cache.py): a question asked again, or in words this
    # close (cosine similarity of the question embeddings), is answered from the cache for
    # this long. An agent switches it off with its setting "answer_cache": false.
    answer_cache: bool = True
    answer_cache_similarity: float = Field(0.92, ge=0.5, le=1.0)
    answer_cache_ttl_seconds: float = Field(24 * 60 * 60.0, gt=0, le=30 * 24 * 60 * 60)
    # Answers a visitor gets per day and an agent gives per month (core/answer/quotas.py);
    # unset or 0: unlimited. An agent's settings "quota_visitor_day" / "quota_agent_month"
    # override them (0 there: unlimited for that agent).
    quota_visitor_day: Annotated[int | None, BeforeValidator(_no_key_when_empty)] = Field(
        None, ge=0
    )
    quota_agent_month: Annotated[int | None, BeforeValidator(_no_key_when_empty)] = Field(
        None, ge=0
    )
    # Visitors' days one network address gets on the widget (a visitor can start a new
    # session at will, an address is shared by an office or a household); 0: not counted.
    quota_address_share: int = Field(5, ge=0, le=1000)

    @model_validator(mode="after")
    def _notify_secret_with_webhook(self) -> Settings:
        if self.notify_webhook is not None and self.notify_secret is None:
            raise ValueError(
                "PARLEY_NOTIFY_SECRET is required when PARLEY_NOTIFY_WEBHOOK is set "
                "(make one with: openssl rand -hex 32)"
            )
        return self

    @property
    def inbox_stuck_after(self) -> float:
        """Seconds after which an unanswered messaging customer counts as kept waiting."""
        return self.holding_message_seconds or 30.0

    @property
    def llm_configured(self) -> bool:
        return self.llm_base_url is not None or self.llm_api_key is not None

    @property
    def llm_timeouts(self) -> LlmTimeouts:
        """The model's deadlines in seconds: a PARLEY_LLM_*_TIMEOUT_SECONDS setting, else the
        older PARLEY_*_TIMEOUT_MS one (still read), else its default."""

        def either(seconds: float | None, ms: int) -> float:
            return seconds if seconds is not None else ms / 1000

        rewrite = either(self.llm_rewrite_timeout_seconds, self.rewrite_timeout_ms)
        return LlmTimeouts(
            queue=self.llm_queue_timeout_seconds,
            first_token=self.llm_first_token_timeout_seconds,
            answer=self.llm_answer_timeout_seconds,
            rewrite=rewrite,
            translate=self.llm_translate_timeout_seconds or rewrite,
            summary=either(self.llm_summary_timeout_seconds, self.summary_timeout_ms),
            critic=either(self.llm_critic_timeout_seconds, self.critic_timeout_ms),
        )


@dataclass(frozen=True, slots=True)
class LlmTimeouts:
    """How long each call to the model may take, in seconds (see `Settings.llm_timeouts`).

    A streamed answer has three: ``queue`` until the server begins its response (connecting
    and waiting for a free slot: the response headers), ``first_token`` from then until the
    first word, ``answer`` from the request until the last word. The others each bound one
    whole call: ``rewrite`` (a follow-up made self-contained), ``translate`` (the question in
    the knowledge's language), ``summary`` (a conversation's summary and topic), ``critic``.
    """

    queue: float
    first_token: float
    answer: float
    rewrite: float
    translate: float
    summary: float
    critic: float


def env_name(field: str) -> str:
    """The environment variable a settings field is read from (for error messages)."""
    info = Settings.model_fields.get(field)
    if info is None:
        return field
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        first = alias.choices[0]
        return first if isinstance(first, str) else field
    return f"PARLEY_{field.upper()}"


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning validation errors into one line per bad variable."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{env_name(field)}: {message}")
        raise ConfigError("invalid setting " + "; ".join(problems)) from None
