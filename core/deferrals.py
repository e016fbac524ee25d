"""Whether an answer says it could not help, in the languages we serve."""

from __future__ import annotations

import re

# How answers say they could not help.
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
