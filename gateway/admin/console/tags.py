"""The settings form's tag filters and URL rules: shown as text, read back as AgentPatch fields."""

from __future__ import annotations

from typing import Any

from channels.registry import CHANNELS
from gateway.admin.console.render import Form, items, lines
from gateway.admin.schemas import AgentOut

LABELS = {
    "include_tags": "Only pages tagged",
    "exclude_tags": "Never pages tagged",
    "tag_rules": "URL rules",
    **{f"channel_filters.{c.name}.include_tags": f"{c.title}: only pages tagged" for c in CHANNELS},
    **{
        f"channel_filters.{c.name}.exclude_tags": f"{c.title}: never pages tagged" for c in CHANNELS
    },
}


def tag_values(agent: AgentOut) -> dict[str, str]:
    """The form's fields as the agent has them: tags comma-separated, one rule a line."""
    values = {
        "include_tags": ", ".join(agent.include_tags),
        "exclude_tags": ", ".join(agent.exclude_tags),
        "tag_rules": "\n".join(f"{r.pattern} {', '.join(r.tags)}" for r in agent.tag_rules),
    }
    for channel in CHANNELS:
        filters = agent.channel_filters.get(channel.name)
        for key in ("include_tags", "exclude_tags"):
            shown = getattr(filters, key) if filters is not None else []
            values[f"{key}_{channel.name}"] = ", ".join(shown)
    return values


def tag_patch(data: Form) -> tuple[dict[str, Any], dict[str, str]]:
    """The AgentPatch fields the form gives, and labels naming each rule by its line."""
    rules = []
    labels = dict(LABELS)
    for number, line in enumerate(lines(data, "tag_rules"), start=1):
        pattern, *rest = line.split(None, 1)
        tags = rest[0] if rest else ""
        rules.append(
            {"pattern": pattern, "tags": [t.strip() for t in tags.split(",") if t.strip()]}
        )
        for field in ("pattern", "tags"):
            labels[f"tag_rules.{number - 1}.{field}"] = f"URL rule {number} ({line[:60]}), {field}"
        labels[f"tag_rules.{number - 1}"] = f"URL rule {number} ({line[:60]})"
    return {
        "include_tags": items(data, "include_tags"),
        "exclude_tags": items(data, "exclude_tags"),
        "tag_rules": rules,
        "channel_filters": {
            c.name: {
                "include_tags": items(data, f"include_tags_{c.name}"),
                "exclude_tags": items(data, f"exclude_tags_{c.name}"),
            }
            for c in CHANNELS
        },
    }, labels
