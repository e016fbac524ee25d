"""The settings page's exploration form: whether the agent answers by exploring its pages, and
the bounds of one exploration, read back as the agent's settings (empty: the default)."""

from __future__ import annotations

from typing import Any

from gateway.admin.console.render import Form, checked, text

LABELS = {
    "settings": "Exploration",
    "exploration_steps": "Tool calls per answer",
    "exploration_seconds": "Seconds per answer",
}


def _number(data: Form, name: str) -> int | float | str | None:
    given = text(data, name).replace(",", ".")
    if not given:
        return None  # the default
    try:
        number = float(given)
    except ValueError:
        return given  # refused by the settings check, which says why
    return int(number) if number.is_integer() else number


def exploration_patch(data: Form) -> dict[str, Any]:
    """The agent's settings as the form gives them; None removes one (the default applies)."""
    return {
        "exploration": True if checked(data, "exploration") else None,
        "exploration_steps": _number(data, "exploration_steps"),
        "exploration_seconds": _number(data, "exploration_seconds"),
    }
