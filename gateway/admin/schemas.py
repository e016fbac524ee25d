"""The admin API's request and response bodies; the OpenAPI document is generated from these."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from channels.base import Channel, TemplateIdField
from channels.credentials import CredentialField
from channels.registry import CHANNELS, channel_names
from core.answer.explore import check_settings as check_exploration_settings
from core.answer.gates import GATES
from core.errors import InvalidInput
from core.patterns import compile_pattern
from core.store.database import MAX_ID
from core.tags import MAX_RULES, TAG_SETTINGS, TagFilters, TagList, TagRule
from core.turns import MAX_MESSAGE_CHARS, PageContext

_LANGUAGE = r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})?$"

# The longest answer an agent may ask the model for, in words.
MAX_WORDS = 2000
# A stored row's id (every id column is a bigint counted from 1).
Id = Annotated[int, Field(ge=1, le=MAX_ID)]


def _written_as_date(value: Any) -> Any:
    # Pydantic would read a number ("0.5") as seconds since 1970; the API takes dates only.
    if isinstance(value, str) and not re.match(r"^\d{4}-\d{2}-\d{2}", value):
        raise ValueError("give a date and time such as 2024-05-31T09:00:00Z")
    return value


def _in_utc(value: datetime) -> datetime:
    # Without an offset it is UTC; a moment UTC has no date for (year 0, year 10000) is refused.
    try:
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except OverflowError:
        raise ValueError("give a date and time from year 1 to 9999 in UTC") from None


# A date and time in a query string, in ISO 8601.
Moment = Annotated[datetime, BeforeValidator(_written_as_date), AfterValidator(_in_utc)]


def _known_channel(value: str) -> str:
    if value not in channel_names():
        raise ValueError(f"{value!r} is not a channel; give one of {', '.join(channel_names())}")
    return value


# A conversation's channel: a messaging channel of the registry, or one answered directly.
ChannelName = Annotated[
    str,
    AfterValidator(_known_channel),
    WithJsonSchema({"type": "string", "enum": list(channel_names())}),
]


def _nul_at(value: Any, where: str) -> str | None:
    """Where in ``value`` a string (or a key) holds a NUL character, or None."""
    if isinstance(value, str):
        return where if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            at = f"{where}.{key}" if where else str(key)
            found = _nul_at(key, at) or _nul_at(item, at)
            if found is not None:
                return found
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _nul_at(item, f"{where}.{index}" if where else str(index))
            if found is not None:
                return found
    return None


def _refuse_nul(data: Any) -> Any:
    # PostgreSQL cannot store NUL in text or jsonb; refused here, with the field named,
    # rather than failing as a 500 halfway through saving.
    where = _nul_at(data, "")
    if where is not None:
        raise ValueError(f"{where or 'value'} contains a NUL character (\\u0000)")
    return data


class Body(BaseModel):
    """Request bodies: unknown fields are refused, so a misspelt setting is not ignored, and
    so is a NUL character in any text. Types are strict: ``false`` is no id and ``"1"`` no
    number."""

    model_config = ConfigDict(
        extra="forbid", str_strip_whitespace=True, strict=True, defer_build=True
    )

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return _refuse_nul(data)


class Out(BaseModel):
    """Response bodies, read from the repositories' dataclasses."""

    model_config = ConfigDict(from_attributes=True, defer_build=True)


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return _refuse_nul(data)


# -- sign-in --------------------------------------------------------------------------------


class SignInBody(Body):
    """The admin token, or a staff account's email address and password."""

    token: str | None = Field(None, min_length=1, max_length=1024)
    email: str | None = Field(None, min_length=3, max_length=254)
    password: str | None = Field(None, min_length=1, max_length=1024)

    @model_validator(mode="after")
    def _one_way(self) -> SignInBody:
        if self.token is None and (self.email is None or self.password is None):
            raise ValueError("give either token, or email and password")
        if self.token is not None and (self.email is not None or self.password is not None):
            raise ValueError("give either token, or email and password, not both")
        return self


class StaffOut(Out):
    id: int | None = Field(description="the staff account; null for the admin token")
    email: str | None
    name: str
    via: Literal["token", "session"]
    role: Literal["admin", "agent"] = Field(
        description="admin: everything; agent: conversations, handoff, content gaps, curated "
        "answers, answer checks and the playground (the admin token is an admin)"
    )


class SessionOut(Out):
    staff: StaffOut
    csrf_token: str | None = Field(
        description="send as X-CSRF-Token with every state-changing request of this session"
    )
    expires_at: datetime | None = None


class StaffMemberOut(Out):
    id: int
    email: str
    display_name: str
    role: Literal["admin", "agent"]
    disabled: bool
    last_sign_in_at: datetime | None
    created_at: datetime


class StaffList(Out):
    items: list[StaffMemberOut]


class StaffPatch(Body):
    """What changes; a field left out stays as it is."""

    role: Literal["admin", "agent"] | None = Field(
        None, description="not your own; the last enabled admin stays an admin"
    )
    disabled: bool | None = Field(
        None, description="a disabled account cannot sign in and its sessions end"
    )


# -- agents ---------------------------------------------------------------------------------


# Each messaging channel's credentials, as the agent's settings block of its name holds them
# (``channels.twilio``, ``channels.telegram``...): the models are made from the channel's
# declared `CredentialField`s, so a channel added to the registry is in the API, the console
# and the OpenAPI document with no change here.

# No credential is this long.
_CREDENTIAL_CHARS = 2048
# A value without a declared form is still one line, without spaces at either end: a token
# pasted with a line break is refused here, rather than stored to fail every webhook.
_ONE_LINE = r"\S(.*\S)?"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _model_name(channel: Channel, suffix: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", channel.block)) + suffix


def _form_check(channel: Channel, spec: CredentialField) -> Callable[[str], str]:
    def check(value: str) -> str:
        if spec.pattern is not None:
            if not re.fullmatch(spec.pattern, value):
                raise ValueError(
                    f"not of the form {channel.title} uses ({spec.help or spec.pattern})"
                )
        elif not re.fullmatch(_ONE_LINE, value) or _CONTROL.search(value):
            raise ValueError("give it on one line, without spaces at either end")
        return value

    return check


def _credential(channel: Channel, spec: CredentialField) -> Any:
    """The type of one field's value in a request: text of the declared form, taken as sent
    (not stripped, so that the document's pattern is what is accepted)."""
    pattern = spec.pattern if spec.pattern is not None else _ONE_LINE
    return Annotated[
        str,
        StringConstraints(strip_whitespace=False, min_length=1, max_length=_CREDENTIAL_CHARS),
        AfterValidator(_form_check(channel, spec)),
        WithJsonSchema(
            {
                "type": "string",
                "minLength": 1,
                "maxLength": _CREDENTIAL_CHARS,
                "pattern": f"^(?:{pattern})$",
            }
        ),
    ]


def _described(spec: CredentialField, *notes: str) -> str:
    said = spec.label + (f" ({spec.help})" if spec.help else "")
    return "; ".join((said, *(n for n in notes if n)))


# -- approved templates (WhatsApp, outside its customer window) -------------------------------

# A template's name as staff pick it (and as Meta names templates).
TEMPLATE_NAME = r"[a-z0-9_]{1,100}"
MAX_TEMPLATES = 100
# WhatsApp's limit for a template's body.
MAX_TEMPLATE_TEXT = 1024
MAX_TEMPLATE_VALUE = 1000
_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}")


def _numbered_placeholders(text: str) -> str:
    """A template's text with placeholders {{1}} to {{n}}, each number used, none skipped:
    the values staff fill in, in order (what Twilio and Meta number them by)."""
    numbers = set()
    for inner in _PLACEHOLDER.findall(text):
        if not re.fullmatch(r"[1-9][0-9]{0,2}", inner):
            raise ValueError(
                f"{{{{{inner}}}}} is not a placeholder: write the values staff fill in as "
                "{{1}}, {{2}}, ..."
            )
        numbers.add(int(inner))
    missing = sorted(set(range(1, max(numbers, default=0) + 1)) - numbers)
    if missing:
        listed = ", ".join(f"{{{{{n}}}}}" for n in missing)
        raise ValueError(
            f"number the placeholders from {{{{1}}}} on without gaps; missing: {listed}"
        )
    return text


def _unique_names(templates: list[Any]) -> list[Any]:
    seen: set[str] = set()
    for template in templates:
        if template.name in seen:
            raise ValueError(f"two templates are named {template.name!r}; give each its own name")
        seen.add(template.name)
    return templates


class ChannelTemplateOut(Out):
    """An approved template as configured for the agent."""

    name: str
    provider_id: str
    language: str
    text: str


def _template_in(channel: Channel) -> type[Body]:
    spec = channel.template_id or TemplateIdField("Template id", _ONE_LINE)
    provider_id = Annotated[
        str,
        StringConstraints(min_length=1, max_length=512, pattern=f"^(?:{spec.pattern})$"),
    ]
    return create_model(
        _model_name(channel, "Template"),
        __base__=Body,
        __doc__=f"An approved {channel.title} template, exactly as the provider approved it.",
        name=(
            str,
            Field(
                pattern=f"^{TEMPLATE_NAME}$",
                description="what staff pick it by: 1-100 of a-z, 0-9 and _",
            ),
        ),
        provider_id=(
            provider_id,
            Field(description=spec.label + (f" ({spec.help})" if spec.help else "")),
        ),
        language=(
            str,
            Field(pattern=_LANGUAGE, description="the approved language (en, nl, pt_BR)"),
        ),
        text=(
            Annotated[str, AfterValidator(_numbered_placeholders)],
            Field(
                min_length=1,
                max_length=MAX_TEMPLATE_TEXT,
                description="the approved text, with {{1}}..{{n}} where staff fill in values; "
                "stored in the conversation once filled in",
            ),
        ),
    )


def _channel_out(channel: Channel) -> type[Out]:
    fields: dict[str, Any] = {
        "configured": (
            bool,
            Field(
                description="the agent has credentials of its own (else the environment's apply)"
            ),
        )
    }
    if channel.customer_window_hours is not None:
        fields["templates"] = (
            list[ChannelTemplateOut],
            Field(
                default_factory=list,
                description="approved templates staff may send once the customer window "
                f"({channel.customer_window_hours:g} hours after the customer's last message) "
                "has closed",
            ),
        )
    for spec in channel.credential_fields:
        if spec.secret:
            fields[f"{spec.name}_set"] = (
                bool,
                Field(False, description=_described(spec, "whether it is stored; never shown")),
            )
        else:
            fields[spec.name] = (str | None, Field(None, description=_described(spec)))
    return create_model(
        _model_name(channel, "Out"),
        __base__=Out,
        __doc__=f"{channel.title}: the agent's own credentials; secrets only as whether set.",
        **fields,
    )


def _channel_patch(channel: Channel) -> type[Body]:
    fields: dict[str, Any] = {}
    for spec in channel.credential_fields:
        notes = (
            "required while the agent has this block" if spec.required else "",
            "write-only: stored encrypted, never shown" if spec.secret else "",
        )
        fields[spec.name] = (
            _credential(channel, spec) | None,
            Field(
                None,
                description=_described(spec, *notes),
                json_schema_extra={"writeOnly": True} if spec.secret else None,
            ),
        )
    if channel.customer_window_hours is not None:
        fields["templates"] = (
            Annotated[
                list[_template_in(channel)],  # type: ignore[misc]
                Field(max_length=MAX_TEMPLATES),
                AfterValidator(_unique_names),
            ]
            | None,
            Field(
                None,
                description="the approved templates staff may send once the customer window "
                "has closed; replaces the stored list ([] or null: none). Templates are not "
                "credentials: an agent with only templates sends with the environment's "
                "account",
            ),
        )
    return create_model(
        _model_name(channel, "Patch"),
        __base__=Body,
        __doc__=f"{channel.title}: fields given replace the stored ones; null removes one.",
        **fields,
    )


# By settings block (``twilio``): the generated models of each channel.
CHANNEL_OUT: Mapping[str, type[Out]] = {c.block: _channel_out(c) for c in CHANNELS}
CHANNEL_PATCH: Mapping[str, type[Body]] = {c.block: _channel_patch(c) for c in CHANNELS}

if TYPE_CHECKING:
    ChannelsOut = Out
    ChannelsPatch = Body
else:
    ChannelsOut = create_model(
        "ChannelsOut",
        __base__=Out,
        __doc__="Whether each messaging channel has credentials of the agent's own; secrets "
        "never shown.",
        **{c.block: (CHANNEL_OUT[c.block], Field(description=c.title)) for c in CHANNELS},
    )
    ChannelsPatch = create_model(
        "ChannelsPatch",
        __base__=Body,
        __doc__="A channel set to null loses the agent's own credentials (the environment's "
        "apply). Secrets are stored encrypted under PARLEY_SECRETS_KEY; without it they are "
        "refused (409).",
        **{
            c.block: (
                CHANNEL_PATCH[c.block] | None,
                Field(None, description=f"{c.title}; null removes the agent's own credentials"),
            )
            for c in CHANNELS
        },
    )


_FEEDBACK_PROMPT = (
    "when staff resolve a WhatsApp or Telegram conversation, ask the customer whether the "
    "bot's last answer helped (Telegram: buttons; WhatsApp: reply 1 or 2, within the "
    "customer window); a no shows among the content gaps"
)


_INCLUDE_TAGS = (
    "only pages with one of these tags answer, on every channel (none: any page); a "
    "request's own filters add to them"
)
_EXCLUDE_TAGS = "pages with one of these tags never answer, on any channel"
_TAG_RULES = (
    "pages whose URL path matches a rule's pattern carry its tags (* matches any characters, "
    "? one); a change retags the stored pages at once"
)
_CHANNEL_FILTERS = (
    "by messaging channel (whatsapp, telegram, meta), tag filters its answers use on top of "
    "the agent's own"
)


def _messaging_channel(value: str) -> str:
    if value not in {c.name for c in CHANNELS}:
        names = ", ".join(c.name for c in CHANNELS)
        raise ValueError(f"{value!r} is not a messaging channel; give one of {names}")
    return value


MessagingChannel = Annotated[
    str,
    AfterValidator(_messaging_channel),
    WithJsonSchema({"type": "string", "enum": [c.name for c in CHANNELS]}),
]


class AgentOut(Out):
    slug: str
    name: str
    default_language: str
    timezone: str
    persona: str
    custom_prompt: str
    confidence_threshold: float
    contact_route: str
    widget_key: str
    allowed_origins: list[str]
    business_hours: dict[str, Any] | None = None
    handoff_enabled: bool = True
    handoff_text: str | dict[str, str] | None = None
    out_of_hours_text: str | dict[str, str] | None = None
    feedback_prompt: bool = Field(False, description=_FEEDBACK_PROMPT)
    include_tags: list[str] = Field(default_factory=list, description=_INCLUDE_TAGS)
    exclude_tags: list[str] = Field(default_factory=list, description=_EXCLUDE_TAGS)
    tag_rules: list[TagRule] = Field(default_factory=list, description=_TAG_RULES)
    channel_filters: dict[str, TagFilters] = Field(
        default_factory=dict, description=_CHANNEL_FILTERS
    )
    settings: dict[str, Any] = Field(
        description="other settings (rate limits, guardrails...); channel secrets left out"
    )
    channels: ChannelsOut
    embedder: str | None
    embedding_dim: int | None
    knowledge_version: int
    created_at: datetime


class AgentList(Out):
    items: list[AgentOut]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_known_settings(settings: dict[str, Any]) -> None:
    """The other settings that every turn reads, in the shape it reads them: refused here
    rather than failing each answer as a 500. Unknown keys are left alone."""
    limits = settings.get("rate_limits")
    if limits is not None:
        if not isinstance(limits, dict) or not set(limits) <= {"session", "ip"}:
            raise ValueError('rate_limits: give {"session": [rate, burst], "ip": [rate, burst]}')
        for scope, pair in limits.items():
            if not isinstance(pair, list) or len(pair) != 2 or not all(map(_number, pair)):
                raise ValueError(f"rate_limits.{scope}: give [messages per second, burst]")
            if pair[0] <= 0 or pair[1] < 1:
                raise ValueError(f"rate_limits.{scope}: the rate must be > 0 and the burst >= 1")
    threshold = settings.get("answer_threshold")
    if threshold is not None and not (_number(threshold) and 0 <= threshold <= 1):
        raise ValueError("answer_threshold: give a number from 0 to 1")
    words = settings.get("max_words")
    if words is not None and not (type(words) is int and 1 <= words <= MAX_WORDS):
        raise ValueError(f"max_words: give a whole number from 1 to {MAX_WORDS}")
    gates = settings.get("answer_gates")
    if gates is not None and not (isinstance(gates, list) and set(gates) <= set(GATES)):
        raise ValueError(f"answer_gates: give a list of {', '.join(GATES)} (or [] for none)")
    _check_answer_cache_and_quotas(settings)
    check_exploration_settings(settings)


def _check_answer_cache_and_quotas(settings: dict[str, Any]) -> None:
    cache = settings.get("answer_cache")
    if cache is not None and not isinstance(cache, bool):
        raise ValueError("answer_cache: give true or false")
    for key in ("quota_visitor_day", "quota_agent_month"):
        limit = settings.get(key)
        if limit is not None and not (type(limit) is int and limit >= 0):
            raise ValueError(f"{key}: give a whole number of answers, 0 for unlimited")


class AgentPatch(Body):
    """Only the fields given change."""

    name: str | None = Field(None, min_length=1, max_length=200)
    persona: str | None = Field(None, max_length=4000)
    custom_prompt: str | None = Field(None, max_length=8000)
    default_language: str | None = Field(None, pattern=_LANGUAGE)
    timezone: str | None = Field(None, min_length=1, max_length=64)
    confidence_threshold: float | None = Field(None, ge=0, le=1)
    contact_route: str | None = Field(None, max_length=500)
    allowed_origins: list[str] | None = Field(None, max_length=100)
    business_hours: dict[str, list[str] | str | None] | None = Field(
        None,
        description='weekday (mon..sun) -> ["09:00-17:30"] or "closed"; {} or null: always',
        examples=[{"mon": ["09:00-17:30"], "sat": "10:00-16:00", "sun": "closed"}],
    )
    handoff_enabled: bool | None = None
    handoff_text: str | dict[str, str] | None = None
    out_of_hours_text: str | dict[str, str] | None = None
    feedback_prompt: bool | None = Field(None, description=_FEEDBACK_PROMPT + "; null: off")
    include_tags: TagList | None = Field(None, description=_INCLUDE_TAGS + "; null: none")
    exclude_tags: TagList | None = Field(None, description=_EXCLUDE_TAGS + "; null: none")
    tag_rules: list[TagRule] | None = Field(
        None, max_length=MAX_RULES, description=_TAG_RULES + "; replaces the stored rules"
    )
    channel_filters: dict[MessagingChannel, TagFilters] | None = Field(
        None, description=_CHANNEL_FILTERS + "; replaces the stored ones (null: none)"
    )
    settings: dict[str, Any] | None = Field(
        None, description="merged into the agent's other settings; a key set to null is removed"
    )
    channels: ChannelsPatch | None = None

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str] | None) -> list[str] | None:
        for origin in value or []:
            if not re.fullmatch(r"https?://[^/\s]+/?", origin):
                raise ValueError(f"{origin!r} is not an origin such as https://shop.example")
        return value

    @field_validator("settings")
    @classmethod
    def _no_secrets_here(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = {c.block for c in CHANNELS} & set(value or {})
        if reserved:
            raise ValueError(f"set {', '.join(sorted(reserved))} through channels")
        named = set(TAG_SETTINGS) & set(value or {})
        if named:
            raise ValueError(f"set {', '.join(sorted(named))} with the field of that name")
        _check_known_settings(value or {})
        return value


# -- conversations --------------------------------------------------------------------------


class ConversationQuery(Query):
    agent: str | None = Field(None, description="an agent's slug")
    channel: ChannelName | None = Field(
        None, description="playground and test conversations are only listed when asked for"
    )
    low_confidence: bool = Field(False, description="only where the latest answer was weak")
    waiting: bool = Field(False, description="only those waiting for staff")
    status: Literal["bot", "waiting_for_staff", "staff"] | None = None
    since: Moment | None = Field(None, description="last message at or after")
    until: Moment | None = Field(None, description="last message before")
    cursor: str | None = Field(None, max_length=200, description="next_cursor of the last page")
    limit: int = Field(50, ge=1, le=200)
    search: str | None = Field(
        None, max_length=200, description="words in a message or the customer's name"
    )
    inbox_status: Literal["open", "pending", "resolved"] | None = None
    view: Literal["all", "mine", "unassigned"] = Field(
        "all", description="mine: assigned to you; unassigned: assigned to nobody"
    )
    label: str | None = Field(None, max_length=50)


class ConversationOut(Out):
    id: int
    agent: str
    agent_name: str
    channel: str
    customer: str = Field(
        description="who staff are talking to: the customer's name, else @handle, else the "
        "channel's own id (conversation_key)"
    )
    customer_name: str | None = Field(
        None, description="as the channel gave it (a WhatsApp profile name, a Telegram name)"
    )
    customer_handle: str | None = Field(None, description="a user name (Telegram), without @")
    conversation_key: str = Field(
        description="the channel's own id of the chat: a phone number, a chat id, a session id"
    )
    status: str
    assigned_to: str | None
    language: str | None
    summary_line: str | None = Field(
        description="the first line of the rolling summary, once there is one"
    )
    confidence: float | None
    threshold: float
    low_confidence: bool
    messages: int
    last_message_at: datetime
    created_at: datetime
    inbox_status: Literal["open", "pending", "resolved"] = "open"
    assignee_id: int | None = Field(None, description="the staff account it is assigned to")
    assignee: str | None = Field(None, description="that teammate's name")
    last_text: str | None = Field(None, description="the last message, cut at 120 characters")
    first_question: str | None = Field(
        None, description="the visitor's first message: shown while there is no summary or topic"
    )
    unread: bool = Field(
        False, description="the visitor wrote after any staff member last opened it"
    )
    labels: list[str] = []
    topic: str | None = Field(
        None,
        description="one line (at most 80 characters) on what the customer wants, written once "
        "after the first exchange: shown while there is no summary_line",
    )


class ConversationPageOut(Out):
    items: list[ConversationOut]
    next_cursor: str | None


class SummaryOut(Out):
    text: str
    through_message: int
    updated_at: datetime


class MessageOut(Out):
    id: int
    role: str
    text: str
    author: str | None
    turn_id: int | None
    generation: int
    delivery_status: str | None
    error_code: str | None
    created_at: datetime


class RetrievedOut(Out):
    url: str
    match: float | None
    score: float | None
    passed: bool
    reasons: list[str]


class TurnTraceOut(Out):
    id: int
    question: str
    rewritten_query: str | None
    confidence: float | None
    low_confidence: bool
    mode: str
    created_at: datetime
    retrieved: list[RetrievedOut]
    cited: list[dict[str, Any]]
    timings_ms: dict[str, float]
    trace: dict[str, Any]


class WindowOut(Out):
    """The channel's customer-service window (WhatsApp): free text reaches the customer only
    within ``hours`` of their last message; after that, only an approved template."""

    hours: float
    open: bool = Field(description="free text may be sent now")
    customer_wrote_at: datetime | None = Field(description="the customer's last message")
    closes_at: datetime | None = Field(
        description="while open: when free text stops reaching the customer (null while the "
        "customer has not written)"
    )
    closed_at: datetime | None = Field(description="once closed: when it closed")


class ConversationDetailOut(Out):
    conversation: ConversationOut
    summary: SummaryOut | None
    messages: list[MessageOut]
    turns: list[TurnTraceOut]
    window: WindowOut | None = Field(
        None, description="the customer window of the conversation's channel; null without one"
    )


class StaffMessageBody(Body):
    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)


class StaffMessageOut(Out):
    message_id: int


class TemplateOut(Out):
    name: str
    provider_id: str = Field(description="Twilio's Content SID, Meta's template name")
    language: str
    text: str = Field(description="with {{1}}..{{n}} where the values go")
    variables: int = Field(description="how many values it takes")


class ConversationTemplatesOut(Out):
    channel: str
    items: list[TemplateOut] = Field(
        description="the agent's approved templates for the conversation's channel"
    )
    window: WindowOut | None = Field(description="null for a channel without a window")


class TemplateSendBody(Body):
    """An approved template, by name, and its values in order ({{1}} first)."""

    name: str = Field(pattern=f"^{TEMPLATE_NAME}$")
    values: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEMPLATE_VALUE)]] = (
        Field(default_factory=list, max_length=100)
    )


# -- the inbox ------------------------------------------------------------------------------


class InboxQuery(Query):
    state: Literal["failed", "stuck"] | None = Field(
        None,
        description="failed: given up on; stuck: still waiting, after a failed try or for "
        "longer than the holding delay; both when unset",
    )
    agent: str | None = Field(None, description="an agent's slug")
    limit: int = Field(200, ge=1, le=1000)


class InboxMessageOut(Out):
    id: int
    agent: str
    channel: str
    customer: str = Field(description="the channel's id of the chat (phone number, chat id)")
    conversation_id: int | None
    text: str = Field(description="what the customer wrote ('' for media without a caption)")
    status: Literal["pending", "processing", "failed"]
    attempts: int
    error: str | None = Field(description="why the last try failed")
    received_at: datetime
    next_attempt_at: datetime | None = Field(description="when it is tried again (pending)")
    holding_sent_at: datetime | None = Field(
        description="when the customer was told the answer is delayed"
    )
    failed_at: datetime | None


class InboxList(Out):
    items: list[InboxMessageOut]
    stuck_after_seconds: float


class InboxRetryBody(Body):
    ids: list[Id] = Field(min_length=1, max_length=5000, description="inbox message ids")


class InboxRetriedOut(Out):
    retried: int = Field(description="messages taken up again (failed or backing off)")


# -- notifications --------------------------------------------------------------------------


class NotificationQuery(Query):
    limit: int = Field(50, ge=1, le=500)


class NotificationOut(Out):
    id: int
    type: Literal["handoff.requested", "conversation.waiting"] = Field(
        description="handoff.requested: the customer asked for a person; conversation.waiting: "
        "a message has waited longer than PARLEY_NOTIFY_WAITING_MINUTES"
    )
    agent: str
    channel: str
    conversation_id: int
    customer: str | None = Field(description="a name or a handle; never a phone number")
    waiting_since: datetime
    created_at: datetime
    status: Literal["pending", "delivered", "failed", "skipped"] = Field(
        description="the webhook delivery: skipped when no PARLEY_NOTIFY_WEBHOOK was set"
    )
    attempts: int
    last_status_code: int | None = Field(description="the receiver's HTTP status, last attempt")
    last_error: str | None
    next_attempt_at: datetime | None = Field(description="when it is tried again (pending)")
    delivered_at: datetime | None


class NotificationList(Out):
    items: list[NotificationOut]
    webhook: bool = Field(description="whether PARLEY_NOTIFY_WEBHOOK is set")


# -- content gaps ---------------------------------------------------------------------------


class GapSourceOut(Out):
    title: str
    url: str


class GapFeedbackOut(Out):
    gap_id: int
    question: str
    answer: str = Field(description="the answer the visitor rated down")
    sources: list[GapSourceOut] = Field(description="the sources shown under that answer")
    comment: str | None = Field(description="what the visitor wrote, if anything")
    created_at: datetime


class GapGroupOut(Out):
    key: int = Field(description="the group's newest gap")
    question: str
    count: int
    examples: list[str]
    languages: list[str]
    gap_ids: list[int]
    first_seen: datetime
    last_seen: datetime
    reasons: list[Literal["weak_match", "deferred", "thumbs_down"]] = Field(
        description="why its questions are gaps: a weak match, deferred to staff, or a "
        "visitor's thumbs-down on the answer"
    )
    feedback: list[GapFeedbackOut] = Field(description="thumbs-down answers, newest first")


class GapList(Out):
    items: list[GapGroupOut]
    grouped_by: Literal["meaning", "wording"]


class ResolveGapsBody(Body):
    gap_ids: list[Id] = Field(min_length=1, max_length=5000, description="a group's gap_ids")


class ResolvedOut(Out):
    resolved: int


# -- reports --------------------------------------------------------------------------------

# The longest period one report covers: a bar per day stays readable.
MAX_REPORT_DAYS = 92


class ReportQuery(Query):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, populate_by_name=True)

    agent: str = Field(min_length=1, max_length=100, description="an agent's slug")
    from_: date | None = Field(
        None,
        alias="from",
        description="first day, in the agent's time zone (default: 29 days before `to`)",
    )
    to: date | None = Field(
        None, description="last day, included, in the agent's time zone (default: today there)"
    )

    @model_validator(mode="after")
    def _period(self) -> ReportQuery:
        if self.from_ is not None and self.to is not None:
            if self.from_ > self.to:
                raise ValueError("from is after to")
            if (self.to - self.from_).days >= MAX_REPORT_DAYS:
                raise ValueError(f"a report covers at most {MAX_REPORT_DAYS} days")
        return self


class ReportFiguresOut(Out):
    day: date | None = Field(description="the day in the agent's time zone; null: the period")
    channel: str | None = Field(description="null: all channels together")
    conversations: int = Field(description="conversations in which the customer wrote")
    questions: int = Field(description="customer messages the bot answered")
    deflected: int = Field(
        description="conversations answered by the bot alone: never waiting for or with staff"
    )
    handed_to_staff: int = Field(description="conversations that asked for or were taken by staff")
    resolved: int = Field(
        description="conversations staff resolved; one resolved again on another day counts "
        "on each day it was resolved"
    )
    thumbs_up: int
    thumbs_down: int
    thumbs_up_rate: float | None = Field(description="thumbs up / all thumbs; null: none given")
    first_token_ms_median: float | None = Field(description="model's first token, milliseconds")
    first_token_ms_p90: float | None
    staff_first_response_s_median: float | None = Field(
        description="seconds from a customer's message to staff's first reply to it"
    )
    cached: int = Field(0, description="answers given from the answer cache")
    cache_hit_rate: float | None = Field(
        None,
        description="answers from the answer cache / all answers of the bot (not staff's, "
        "small talk or quota messages); null: none",
    )


class ReportGapOut(Out):
    question: str
    count: int
    last_seen: datetime


class ReportChannelOut(Out):
    name: str
    title: str


class ReportOut(Out):
    agent: str
    timezone: str = Field(description="days are counted in this time zone")
    first_day: date = Field(description="the period's first day (the query's from)")
    last_day: date = Field(description="the period's last day, included (the query's to)")
    channels: list[ReportChannelOut] = Field(description="the channels with figures, in order")
    days: list[ReportFiguresOut] = Field(
        description="per day and channel; a day without a row on a channel had nothing there"
    )
    per_channel: list[ReportFiguresOut] = Field(description="per channel, the whole period")
    total: ReportFiguresOut = Field(description="all channels, the whole period")
    feedback_recorded: bool = Field(description="false: no feedback is stored yet")
    gaps: list[ReportGapOut] = Field(
        description="the most asked open content gaps that were asked in the period"
    )


# -- sources --------------------------------------------------------------------------------

_SOURCE_TAGS = "the source's own tags: every page read from it carries them"


class SourceOut(Out):
    id: int
    kind: str
    location: str
    status: str
    last_crawled_at: datetime | None
    last_error: str | None
    pages: int
    tags: list[str] = Field(default_factory=list, description=_SOURCE_TAGS)
    running: bool = Field(False, description="being indexed by this gateway right now")


class SourceList(Out):
    items: list[SourceOut]


class SourcePatch(Body):
    tags: TagList = Field(
        description=_SOURCE_TAGS + "; replaces them, and its pages carry the new ones at once"
    )


class PageQuery(Query):
    after: int = Field(0, ge=0, le=MAX_ID, description="next_after of the last page of pages")
    limit: int = Field(100, ge=1, le=500)


class PageOut(Out):
    id: int
    source_id: int
    url: str
    title: str
    tags: list[str] = Field(
        description="all it carries: its own, its source's and the agent's URL rules'"
    )
    own_tags: list[str] = Field(
        description="its own: as staff set them, else as its source gave them (a .jsonl line)"
    )
    own_tags_edited: bool = Field(
        description="staff set its own tags: reading the source again keeps them"
    )
    fetched_at: datetime


class PageList(Out):
    items: list[PageOut]
    next_after: int | None = Field(description="pass as after for the next ones; null: no more")


class PagePatch(Body):
    own_tags: TagList | None = Field(
        description="the page's own tags (replacing those its source gave it); null: those "
        "its source gives it again. Its chunks carry the result at once"
    )


class SourceBody(Body):
    """A page or site to crawl (url), a sitemap, or text to index as one page."""

    kind: Literal["url", "sitemap", "text"]
    tags: TagList | None = Field(
        None, description=_SOURCE_TAGS + "; null: those it has (none for a new source)"
    )
    url: str | None = Field(
        None, max_length=2048, description="what to crawl; for text, the URL it is cited under"
    )
    title: str | None = Field(None, max_length=300, description="text only")
    text: str | None = Field(None, max_length=200_000, description="text only (Markdown)")

    @model_validator(mode="after")
    def _complete(self) -> SourceBody:
        if self.url is not None and not re.match(r"^(https?://[^/\s]+|/)\S*$", self.url):
            raise ValueError("url must be an http(s) URL (or, for text, a path starting with /)")
        if self.kind != "text":
            if self.url is None or not self.url.startswith(("http://", "https://")):
                raise ValueError(f"a {self.kind} source needs an http(s) url")
            if self.text is not None or self.title is not None:
                raise ValueError("title and text are for text sources")
        elif not self.text:
            raise ValueError("a text source needs text")
        elif self.url is None and not self.title:
            raise ValueError("a text source needs a title or a url")
        return self


class RemovedOut(Out):
    pages_removed: int


# -- curated answers ------------------------------------------------------------------------


def _check_pattern(value: str | None) -> str | None:
    # Compiled by the engine that will match it (RE2), so what is saved can be matched.
    if value:
        try:
            compile_pattern(value)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
    return value or None


class CuratedBody(Body):
    """A canned answer and what triggers it: a similar question, a keyword or a pattern."""

    answer: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    question: str = Field("", max_length=1000)
    keywords: list[str] = Field(default_factory=list, max_length=50)
    pattern: str | None = Field(None, max_length=500, description="a regular expression")
    language: str | None = Field(None, pattern=_LANGUAGE)
    enabled: bool = True

    _pattern = field_validator("pattern")(_check_pattern)

    @model_validator(mode="after")
    def _has_trigger(self) -> CuratedBody:
        if not (self.question or self.pattern or any(k.strip() for k in self.keywords)):
            raise ValueError("give a question, keywords or a pattern that triggers the answer")
        return self


class CuratedPatch(Body):
    answer: str | None = Field(None, min_length=1, max_length=MAX_MESSAGE_CHARS)
    question: str | None = Field(None, max_length=1000)
    keywords: list[str] | None = Field(None, max_length=50)
    pattern: str | None = Field(None, max_length=500)
    language: str | None = Field(None, pattern=_LANGUAGE)
    enabled: bool | None = None

    _pattern = field_validator("pattern")(_check_pattern)


class CuratedOut(Out):
    id: int
    question: str
    keywords: list[str]
    pattern: str | None
    answer: str
    language: str | None
    enabled: bool
    hit_count: int
    created_at: datetime
    updated_at: datetime


class CuratedList(Out):
    items: list[CuratedOut]


# -- answer checks --------------------------------------------------------------------------


class CheckBody(Body):
    """A test question asked nightly: the answer must hold each fact and/or cite the URL."""

    question: str = Field(min_length=1, max_length=1000)
    expected_facts: list[str] = Field(default_factory=list, max_length=20)
    must_cite: str | None = Field(None, max_length=2048)
    language: str | None = Field(None, pattern=_LANGUAGE)

    @model_validator(mode="after")
    def _has_expectation(self) -> CheckBody:
        if not any(f.strip() for f in self.expected_facts) and not self.must_cite:
            raise ValueError("give expected_facts or must_cite")
        return self


class CheckOut(Out):
    id: int
    question: str
    expected_facts: list[str]
    must_cite: str | None
    language: str | None
    created_at: datetime


class CheckList(Out):
    items: list[CheckOut]


class CheckResultOut(Out):
    id: int
    run_id: int
    check_id: int
    question: str
    passed: bool
    answer: str
    missing_facts: list[str]
    cited_urls: list[str]
    cited_ok: bool | None
    confidence: float | None
    error: str | None
    turn_id: int | None
    created_at: datetime


class CheckResultList(Out):
    items: list[CheckResultOut]


class CheckResultQuery(Query):
    latest: bool = Field(False, description="only the latest result of each check")
    limit: int = Field(200, ge=1, le=1000)


# -- playground -----------------------------------------------------------------------------


class PlaygroundBody(Body):
    """A message to the agent as a visitor would send it, with overrides for this chat only."""

    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    session_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_-]{8,100}$", description="keeps a playground chat going"
    )
    language: str | None = Field(None, pattern=_LANGUAGE, description="reply language")
    segment: str | None = Field(None, max_length=100, description="customer segment")
    site_type: str | None = Field(None, max_length=100, description="e.g. shop, saas, public")
    page: PageContext | None = None
    diagnostics: bool = Field(True, description="end with a diagnostics event (the turn trace)")


# -- privacy requests -----------------------------------------------------------------------

# The channel's own id of a customer: a widget session id, whatsapp:+316..., a chat id.
CustomerId = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class CustomerEraseBody(Body):
    channel: ChannelName
    id: CustomerId = Field(description="the channel's own id of the customer (conversation key)")


class CustomerExportQuery(Query):
    channel: ChannelName
    id: CustomerId = Field(description="the channel's own id of the customer (conversation key)")
    traces: bool = Field(False, description="also each turn's trace: what was searched and found")


class ErasedOut(Out):
    """How many rows of each kind were removed. Usage totals hold nothing of anyone and stay;
    media is never stored, so there is none to remove."""

    conversations: int
    messages: int
    summaries: int
    turns: int
    content_gaps: int
    feedback: int
    inbox: int
    outbox: int


class CustomerErasureOut(Out):
    agent: str
    channel: str
    erased: ErasedOut
    cached_memory_forgotten: int = Field(description="conversations whose cached memory went")
    media: Literal["none stored"] = "none stored"
    audit_customer_hash: str = Field(
        description="how the audit log names the customer: a keyed hash, never the id"
    )


class ExportedMessageOut(Out):
    role: str = Field(description="visitor, assistant, staff or system")
    text: str
    created_at: datetime


class ExportedTurnOut(Out):
    query: str
    rewritten_query: str | None
    confidence: float | None
    mode: str
    trace: dict[str, Any]
    created_at: datetime


class ExportedConversationOut(Out):
    id: int
    channel: str
    customer_name: str | None
    language: str | None
    status: str
    created_at: datetime
    last_message_at: datetime
    summary: str | None
    messages: list[ExportedMessageOut]
    turns: list[ExportedTurnOut] | None = Field(None, description="only when traces were asked")


class CustomerExportOut(Out):
    agent: str
    channel: str
    customer: str
    exported_at: datetime
    conversations: list[ExportedConversationOut]


class ErrorDetail(Out):
    code: str
    message: str


class ErrorOut(Out):
    """Every error: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail
