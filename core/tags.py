"""Tags of pages and sources: how one is written, the filters a turn takes, and the agent's
rules that tag pages by their URL path."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from core.errors import InvalidInput
from core.turns import TAG_PATTERN

_TAG = re.compile(TAG_PATTERN.removesuffix("$"))
# What a request may send for one tag: as stored, or with spaces around it and capitals.
TAG_INPUT_PATTERN = r"^\s*\w[\w:/.-]{0,63}\s*$"
MAX_TAGS = 32  # on one page or source, in one filter
MAX_RULES = 100
TAG_HINT = "letters, digits and - _ . / : (at most 64, starting with a letter or digit)"

# Agent settings keys.
INCLUDE_TAGS = "include_tags"
EXCLUDE_TAGS = "exclude_tags"
TAG_RULES = "tag_rules"
CHANNEL_FILTERS = "channel_filters"
TAG_SETTINGS = (INCLUDE_TAGS, EXCLUDE_TAGS, TAG_RULES, CHANNEL_FILTERS)


def normalise_tag(value: object) -> str:
    """``value`` as a tag is stored (stripped, lower-case); ValueError naming it if it is none."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a tag: give a string")
    tag = value.strip().lower()
    if not _TAG.fullmatch(tag):
        raise ValueError(f"{value!r} is not a tag: use {TAG_HINT}")
    return tag


def normalise_tags(values: Iterable[object], *, what: str = "tags") -> tuple[str, ...]:
    """Each of ``values`` as a tag, sorted and once each; `InvalidInput` naming ``what`` (a
    field, a file's line) and the first that is not a tag."""
    try:
        tags = sorted({normalise_tag(v) for v in values})
    except ValueError as exc:
        raise InvalidInput(f"{what}: {exc}") from None
    if len(tags) > MAX_TAGS:
        raise InvalidInput(f"{what}: at most {MAX_TAGS} tags")
    return tuple(tags)


def _tag_list(value: object) -> object:
    if not isinstance(value, list | tuple):
        return value  # the list type says what is wrong
    return sorted({normalise_tag(v) for v in value})


# A tag as a request body gives it: validated with a clear message, then stored lower-case.
Tag = Annotated[str, Field(pattern=TAG_INPUT_PATTERN), BeforeValidator(normalise_tag)]
TagList = Annotated[list[Tag], Field(max_length=MAX_TAGS), BeforeValidator(_tag_list)]


class TagFilters(BaseModel):
    """Which pages may answer: only those with one of ``include_tags`` (none given: any),
    never those with one of ``exclude_tags``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    include_tags: TagList = Field(
        default_factory=list, description="only pages with at least one of these tags answer"
    )
    exclude_tags: TagList = Field(
        default_factory=list, description="pages with any of these tags never answer"
    )

    @property
    def include(self) -> tuple[str, ...]:
        return tuple(self.include_tags)

    @property
    def exclude(self) -> tuple[str, ...]:
        return tuple(self.exclude_tags)


NO_FILTERS = TagFilters()


def _pattern(value: object) -> object:
    if isinstance(value, str) and (not value.startswith("/") or re.search(r"\s", value)):
        raise ValueError(
            f"{value!r} is not a URL path pattern: start with / and use no spaces "
            "(* matches any characters, ? one)"
        )
    return value


class TagRule(BaseModel):
    """Pages whose URL path matches ``pattern`` (a glob: ``*`` any characters, "/" too,
    ``?`` one) carry ``tags``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: Annotated[
        str,
        Field(min_length=1, max_length=300, pattern=r"^/\S*$", examples=["/blog/*"]),
        BeforeValidator(_pattern),
    ]
    tags: Annotated[TagList, Field(min_length=1)]


def _validated(model: type[BaseModel], value: object, what: str) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in (what, *problem["loc"]))
        message = re.sub(r"^Value error, ", "", problem["msg"])
        raise InvalidInput(f"{where}: {message}") from None


def tag_rules(value: object) -> tuple[TagRule, ...]:
    """The agent settings' ``tag_rules``, checked; `InvalidInput` naming the rule at fault."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidInput(f'{TAG_RULES}: give a list of {{"pattern": "/blog/*", "tags": [...]}}')
    if len(value) > MAX_RULES:
        raise InvalidInput(f"{TAG_RULES}: at most {MAX_RULES} rules")
    return tuple(_validated(TagRule, rule, f"{TAG_RULES}.{i}") for i, rule in enumerate(value))


def channel_filters(settings: Mapping[str, Any], channel: str) -> TagFilters:
    """The agent's own tag filters for one messaging channel (settings "channel_filters"),
    on top of its filters for every channel; none when it has none."""
    block = settings.get(CHANNEL_FILTERS)
    own = block.get(channel) if isinstance(block, Mapping) else None
    if not isinstance(own, Mapping):
        return TagFilters()
    try:
        return TagFilters.model_validate(dict(own))
    except ValidationError:
        return TagFilters()  # refused when set through the admin API; never fails a turn
