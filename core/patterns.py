"""Staff-written patterns (curated-answer triggers), matched by RE2 in time linear in the text.

Python's ``re`` backtracks: a pattern such as ``^(\\w+\\s?)+$`` takes seconds on 27 letters and
an exclamation mark, and minutes on a few more, while it holds the event loop and with it every
request of the process. RE2 never backtracks, so a match costs time in proportion to the text
whatever the pattern. The price is its syntax: no look-ahead, look-behind or back-references.
Patterns are checked with the engine that matches them, when they are saved and again when
they are read, so a pattern that was saved is a pattern that can be matched.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import re2

from core.errors import InvalidInput

MAX_PATTERN_CHARS = 500
# RE2's memory budget for one pattern: a pattern too big for it ("(\w+){1000}") is refused; a
# search that outgrows it goes on with RE2's slower automaton, still in linear time.
_MAX_MEMORY = 2 << 20

# In Python's re, \w, \d and \s mean Unicode letters, digits and spaces; in RE2 they are ASCII,
# so that "\w+" would stop inside "Größe". They are spelt out as Unicode classes so that
# patterns written for re keep matching what they matched. \b stays ASCII in RE2.
_SPACE = r"\s\x0b\x1c-\x1f\x85\p{Z}"
_WORD = r"\p{L}\p{N}_"
_OUTSIDE_CLASS = {
    "w": f"[{_WORD}]",
    "W": f"[^{_WORD}]",
    "d": r"\p{Nd}",
    "D": r"\P{Nd}",
    "s": f"[{_SPACE}]",
    "S": f"[^{_SPACE}]",
    "Z": r"\z",  # Python's end of text; RE2 knows only \z
}
_INSIDE_CLASS = {"w": _WORD, "d": r"\p{Nd}", "s": _SPACE}


@dataclass(frozen=True, slots=True)
class StaffPattern:
    """A compiled pattern; matching ignores case."""

    source: str
    regex: Any  # re2._Regexp (the package ships no type information)

    def search(self, text: str) -> bool:
        return self.regex.search(text) is not None


def compile_pattern(pattern: str) -> StaffPattern:
    """``pattern`` compiled by RE2, or InvalidInput saying why it cannot be matched."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidInput(f"a pattern has at most {MAX_PATTERN_CHARS} characters")
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False
    options.max_mem = _MAX_MEMORY
    try:
        regex = re2.compile(_unicode_classes(pattern), options)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise InvalidInput(
            f"cannot be matched: {detail} (patterns use RE2 syntax, which has no look-ahead, "
            "look-behind or back-references)"
        ) from None
    return StaffPattern(pattern, regex)


@lru_cache(maxsize=1024)
def cached_pattern(pattern: str) -> StaffPattern | None:
    """The compiled pattern, compiled once per process; None when it cannot be matched."""
    try:
        return compile_pattern(pattern)
    except InvalidInput:
        return None


def _unicode_classes(pattern: str) -> str:
    """``pattern`` with \\w, \\d, \\s (and their opposites) as the Unicode classes that
    Python's re gives them; everything else is left as written."""
    out: list[str] = []
    in_class = False
    first_member = -1  # where a "]" is a member, not the end of the class: "[]a]", "[^]a]"
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            table = _INSIDE_CLASS if in_class else _OUTSIDE_CLASS
            out.append(table.get(escaped, char + escaped))
            i += 2
            continue
        if in_class:
            if char == "]" and i != first_member:
                in_class = False
        elif char == "[":
            in_class = True
            first_member = i + 2 if pattern[i + 1 : i + 2] == "^" else i + 1
        out.append(char)
        i += 1
    return "".join(out)
