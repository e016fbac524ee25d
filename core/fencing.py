"""Quoting text in a prompt as data: a ``<tag>`` block its text can neither close nor escape,
however the text spells the tags (zero-width characters, fullwidth or look-alike brackets,
letters of other scripts that look Latin)."""

from __future__ import annotations

import re
import unicodedata
from functools import cache

from confusable_homoglyphs import confusables

# Every block a prompt quotes text in: the answer's sources, notes and page, a translated
# query, a transcript to summarise. Text quoted in one may open or close none of them.
FENCE_TAGS = ("sources", "source", "summary", "page", "query", "messages")
_FENCE_TAG = re.compile(r"<\s*(/?)\s*(" + "|".join(FENCE_TAGS) + r")\b", re.IGNORECASE)

# Invisible characters outside the format category (Cf) that a tag may be spelt with: the
# combining grapheme joiner, Hangul fillers and variation selectors (Unicode's
# Default_Ignorable_Code_Point, less the Cf characters found by category).
_IGNORABLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0"
    + "".join(map(chr, range(0xFE00, 0xFE10)))
    + "".join(map(chr, range(0xE0100, 0xE01F0)))
)
# Names of the characters drawn like the ASCII ones a tag is written with.
_DRAWN_LIKE = (
    (("LESS-THAN", "LEFT-POINTING ANGLE", "LEFT ANGLE BRACKET", "LEFT ARROWHEAD"), "<"),
    (("SOLIDUS", "SLASH"), "/"),
)


def fenced(tag: str, text: str, **attributes: str) -> str:
    """``text`` as data in a ``<tag>`` block it cannot break out of."""
    attrs = "".join(f' {name}="{_attr(value)}"' for name, value in attributes.items())
    return f"<{tag}{attrs}>\n{neutralise(text)}\n</{tag}>"


def _attr(value: str) -> str:
    value = unicodedata.normalize("NFKC", value).replace("&", "&amp;").replace('"', "&quot;")
    return neutralise(value).replace("<", "&lt;")


def neutralise(text: str) -> str:
    """``text`` with every opening or closing of a fence tag made harmless ("&lt;/page"),
    in whatever characters it is spelt; nothing else of it changes."""
    if text.isascii():
        return _FENCE_TAG.sub(_escaped, text)
    if not _openers().search(text):
        return text  # no character that could be read as "<": no tag
    # The text as it reads, one character for each visible one, and where each came from.
    read: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        if char.isascii():
            read.append(char)
        elif _invisible(char):
            continue
        else:
            read.append(_lookalike(char))
        origin.append(index)
    pieces: list[str] = []
    last = 0
    for match in _FENCE_TAG.finditer("".join(read)):
        start, end = origin[match.start()], origin[match.end() - 1] + 1
        pieces += [text[last:start], _escaped(match)]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def _escaped(match: re.Match[str]) -> str:
    return f"&lt;{match.group(1)}{match.group(2)}"


def _invisible(char: str) -> bool:
    return unicodedata.category(char) == "Cf" or char in _IGNORABLE


@cache
def _lookalike(char: str) -> str:
    """The ASCII character ``char`` is drawn like, or ``char`` itself: its compatibility
    form ("＜" is "<"), its confusable in Unicode's confusables list ("р" of Cyrillic is "p"),
    or, for brackets and slashes the list leaves out ("〈"), the one its name says."""
    folded = unicodedata.normalize("NFKC", char)
    if len(folded) == 1 and folded.isascii():
        return folded
    for candidate in dict.fromkeys((char, folded)):
        for found in confusables.is_confusable(candidate, greedy=True) or ():
            for glyph in found["homoglyphs"]:
                if len(glyph["c"]) == 1 and glyph["c"].isascii():
                    return str(glyph["c"])
    name = unicodedata.name(char, "")
    for words, ascii_char in _DRAWN_LIKE:
        if any(word in name for word in words):
            return ascii_char
    return char


@cache
def _openers() -> re.Pattern[str]:
    """The characters read as "<": the only ones that can begin a tag."""
    found = {"<"}
    for found_entry in confusables.is_confusable("<", greedy=True) or ():
        found.update(g["c"] for g in found_entry["homoglyphs"] if len(g["c"]) == 1)
    for code in range(0x80, 0x10000):
        char = chr(code)
        name = unicodedata.name(char, "")
        if any(word in name for word in _DRAWN_LIKE[0][0]) or (
            unicodedata.normalize("NFKC", char) == "<"
        ):
            found.add(char)
    return re.compile("[" + re.escape("".join(sorted(found))) + "]")
