"""The settings form's answer cache switch and quotas: shown as the agent has them, read back
as the agent's settings (left empty: the server's default)."""

from __future__ import annotations

from typing import Any

from gateway.admin.console.render import Form, checked, text
from gateway.admin.schemas import AgentOut

QUOTAS = ("quota_visitor_day", "quota_agent_month")
LABELS = {
    "settings": "Answer cache and quotas",
    "answer_cache": "Answer repeated questions from the answer cache",
    "quota_visitor_day": "Answers per visitor per day",
    "quota_agent_month": "Answers per month",
}


def limit_values(agent: AgentOut) -> dict[str, Any]:
    settings = agent.settings
    values: dict[str, Any] = {"answer_cache": settings.get("answer_cache") is not False}
    for key in QUOTAS:
        own = settings.get(key)
        values[key] = "" if own is None else str(own)
    return values


def _quota(data: Form, name: str) -> int | str | None:
    given = text(data, name)
    if not given:
        return None  # the server's default
    return int(given) if given.isdigit() else given  # anything else is refused, and said why


def limit_patch(data: Form) -> dict[str, Any]:
    """The agent's settings as the form gives them; None removes one (the default applies)."""
    return {
        "answer_cache": None if checked(data, "answer_cache") else False,
        **{key: _quota(data, key) for key in QUOTAS},
    }
