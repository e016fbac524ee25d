"""Content gaps: questions the website's content could not answer, for staff to fill."""

from __future__ import annotations

from core.deferrals import is_deferred


def gap_reason(answer: str, low_confidence: bool) -> str | None:
    if low_confidence:
        return "weak_match"
    if is_deferred(answer):
        return "deferred"
    return None
