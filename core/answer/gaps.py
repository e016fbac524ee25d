"""Content gaps: questions the website's content could not answer, for staff to fill."""

from __future__ import annotations

import re

# How answers say they could not help, in the languages we serve.
_DEFERRED = re.compile(
    r"don'?t know|do not know|not sure|can(?:'|no)t find|could(?:n'?t| not) (?:find|verify)|"
    r"no information|not in the (?:website|information)|"
    r"weet ik niet|niet zeker|kan ik niet vinden|kon ik niet (?:vinden|verifiëren)|"
    r"geen informatie|"
    r"weiß ich nicht|nicht sicher|kann ich nicht finden|konnte ich nicht (?:finden|überprüfen)|"
    r"keine informationen|"
    r"je ne sais pas|pas sûr|je ne trouve pas|n'ai pas trouvé|pas d'information",
    re.IGNORECASE,
)


def is_deferred(answer: str) -> bool:
    return _DEFERRED.search(answer) is not None


def gap_reason(answer: str, low_confidence: bool) -> str | None:
    if low_confidence:
        return "weak_match"
    if is_deferred(answer):
        return "deferred"
    return None
