"""Post-processing of a finished answer: citations, copied prompt markup and glued numbers."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The tags our prompt wraps things in (see core.answer.prompt); a model sometimes copies them.
PROMPT_TAGS = ("source", "sources", "history", "summary", "page")


@dataclass(frozen=True, slots=True)
class Processed:
    text: str
    # 1..n: the answer's citations, renumbered in the order the text first uses them, so the
    # visitor reads [1], [2], ... and a source list numbered the same way.
    citations: tuple[int, ...]
    # The prompt's number of each cited source: citation n cites source source_numbers[n - 1].
    source_numbers: tuple[int, ...]


def postprocess(answer: str, source_count: int, source_texts: Sequence[str]) -> Processed:
    """The answer as shown and stored: clean citations, no prompt notes, numbers spaced."""
    text = _strip_tags(answer)
    text, listed = _drop_note_lines(text)
    text = _normalise_citations(text, source_count)
    text = _respace(text, source_texts)
    text = _tidy(text)
    cited = [int(n) for n in _CITATION.findall(text)]
    valid_listed = [n for n in listed if 1 <= n <= source_count]
    # Sources named only on a dropped "Sources: ..." line come after those the text cites.
    order = tuple(dict.fromkeys([*cited, *valid_listed]))
    text = _renumber(text, {old: new for new, old in enumerate(order, start=1)})
    return Processed(text, tuple(range(1, len(order) + 1)), order)


# -- prompt markup ----------------------------------------------------------------------

_TAG = re.compile(r"(?:<|&lt;)/?(?:" + "|".join(PROMPT_TAGS) + r")\b[^<>\n]*>", re.IGNORECASE)


def _strip_tags(text: str) -> str:
    return _TAG.sub("", text)


# Words naming our sources and instructions, in the languages we serve.
_LABEL = r"(?:sources?|bron(?:nen)?|quellen?)"
_THE = r"(?:the|these|those|de|deze|die|der|den|dem|les|la|le)"
_NUMBERS = r"\d{1,3}(?:\s*(?:,|;|&|\band\b|\ben\b|\bund\b|\bet\b)\s*\d{1,3})*"
_BASED_ON = (
    r"(?:based on|according to|see|from|volgens|gebaseerd op|op basis van|zie|uit|laut|"
    r"basierend auf|gemäß|siehe|aus|selon|d'après|sur la base de|voir|cf\.?)"
)
_NOTE_WORD = (
    r"(?:please note|note|nb|n\.b\.|disclaimer|opmerking|let op|noot|hinweis|anmerkung|"
    r"beachte|remarque|à noter)"
)
_ABOUT_SOURCES = (
    rf"(?:\b{_THE}\s+(?:provided\s+|given\s+|available\s+|verstrekte\s+|gegeven\s+|"
    rf"beschikbare\s+|bereitgestellten\s+|vorliegenden\s+|fournies\s+)?"
    rf"(?:sources?|bronnen|quellen|instructions?|instructies|anweisungen|context|kontext|"
    rf"contexte|documents?|documenten|dokumente)\b)"
)
_NOTE_MAX = 300  # characters; a longer line is content, whatever it starts with
# A note about the sources: a note word, then something about what the sources say.
_NOTE_LINE = re.compile(
    rf"^\(?\s*{_NOTE_WORD}\b\s*(?::|that|dat|dass|que)?\s.*{_ABOUT_SOURCES}.*\b(?:mention|"
    rf"contain|provide|include|say|state|specif|cover|based|only|noem|vermeld|bevat|beschrijf|"
    rf"geven|erwähn|enthalt|enthält|nennen|angeben|beschreib|mentionn|contien|précis|indiqu|"
    rf"fourni|do not|does not|don't|doesn't|geen|keine|aucun|pas)",
    re.IGNORECASE,
)
# A line that only says where the answer came from: "(Based on source 2)", "Sources: [1], [3]".
_SOURCE_LINE = re.compile(
    rf"^\(?\s*(?:{_BASED_ON}\s+)?(?:{_THE}\s+)?(?:provided\s+|given\s+)?{_LABEL}"
    r"(?:\s+provided)?\s*:?\s*((?:[\[\]\d\s,;&]|\b(?:and|en|und|et)\b)*)\)?\s*\.?$",
    re.IGNORECASE,
)


def _drop_note_lines(text: str) -> tuple[str, list[int]]:
    """Remove lines that only talk about the sources; numbers they name are returned."""
    kept: list[str] = []
    listed: list[int] = []
    for line in text.split("\n"):
        core = line.strip().strip("*_>").strip()
        if len(core) <= _NOTE_MAX and _NOTE_LINE.match(core):
            continue
        source_line = _SOURCE_LINE.match(core) if core else None
        if source_line:
            listed += [int(n) for n in re.findall(r"\d+", source_line.group(1))]
            continue
        kept.append(line)
    return "\n".join(kept), listed


# -- citations --------------------------------------------------------------------------

_CITATION = re.compile(r"\[(\d+)\](?!\()")
_CITATION_FORMS = re.compile(
    # The space before a citation goes with it when the citation goes.
    r"(?P<space>[ \t]*)(?:"
    + "|".join(
        [
            # [1]  [2, 3]  [^1]  [source 2]  [Bron: 2]  [Quellen 1 und 2]; not a link [1](...)
            rf"\[\s*\^?(?:{_LABEL}\s*:?\s*(?:#|nr\.?|no\.?)?\s*)?(?P<b>{_NUMBERS})\s*\](?!\()",
            # 【1】  【2†source】  【3:0†source】
            rf"【\s*(?:{_LABEL}\s*:?\s*)?(?P<f>{_NUMBERS})(?:[:†][^】]*)?\s*】",
            # (source 2)  (based on source 2)  (volgens bron 1 en 3)
            rf"\(\s*(?:{_BASED_ON}\s+)?(?:{_THE}\s+)?{_LABEL}\s*:?\s*(?P<p>{_NUMBERS})\s*\)",
        ]
    )
    + ")",
    re.IGNORECASE,
)


def _normalise_citations(text: str, source_count: int) -> str:
    def replace(match: re.Match[str]) -> str:
        found = match["b"] or match["f"] or match["p"] or ""
        numbers = [int(n) for n in re.findall(r"\d+", found)]
        kept = "".join(f"[{n}]" for n in dict.fromkeys(numbers) if 1 <= n <= source_count)
        return match["space"] + kept if kept else ""

    text = _CITATION_FORMS.sub(replace, text)
    # "[1][1]" and "[1] [1]" say it once
    return re.sub(r"\[(\d+)\](?:[ \t]*\[\1\])+", r"[\1]", text)


# Citations side by side: "[2][3]", "[3] [1]".
_CITATION_RUN = re.compile(r"\[\d+\](?!\()(?:[ \t]*\[\d+\](?!\())*")


def _renumber(text: str, numbers: dict[int, int]) -> str:
    """Every citation [old] as [numbers[old]]; a group reads in ascending order ("[1][2]")."""

    def replace(match: re.Match[str]) -> str:
        run = match.group()
        new = sorted({numbers[int(n)] for n in _CITATION.findall(run)})
        return (" " if re.search(r"\s", run) else "").join(f"[{n}]" for n in new)

    return _CITATION_RUN.sub(replace, text)


# -- numbers glued to words -------------------------------------------------------------

_VOWELS = set("aeiouyàáâäãåæèéêëìíîïòóôöõøœùúûüÿ")
# Short words that come before a number in our languages ("ab 49,95", "om 17:00", "in 3").
_SHORT_WORDS = frozenset({
    "ab", "am", "an", "at", "au", "bis", "by", "ca", "de", "du", "en", "im", "in", "la", "le",
    "na", "of", "om", "on", "op", "te", "to", "um", "zu", "à",
})  # fmt: skip
# Lowercase words with a vowel that are glued to numbers on purpose: units, standards, codes.
_NOT_WORDS = frozenset({
    "aac", "aes", "amd", "arm", "art", "base", "css", "dpi", "ean", "gen", "gtin", "html",
    "ios", "ipad", "iphone", "ipv", "isbn", "kcal", "log", "mah", "mpeg", "ogg", "pcie", "php",
    "ppi", "psi", "python", "ref", "sha", "sku", "tls", "upc", "usb", "utf", "vue", "web",
    "wifi", "win", "wpa", "xbox",
})  # fmt: skip
_GLUED = re.compile(
    r"(?P<lead>[(\[\"'‘“«*_]*)"
    r"(?P<word>[^\W\d_]+)"
    r"(?P<number>(?P<digits>\d+)(?:[.,:\-–/]\d+)*)"
    r"(?P<trail>[.,;:!?)\]}\"'’”»*_…%€$£]*)"
)
_SOURCE_GLUED = re.compile(r"[^\W\d_]+\d+")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _is_word(letters: str) -> bool:
    """Whether ``letters`` before a number look like an ordinary word, not a code or unit."""
    if not letters.islower():
        return False  # "RAL", "SKU", "Trail", "iPhone": names and codes
    if len(letters) < 3:
        return letters in _SHORT_WORDS
    return letters not in _NOT_WORDS and any(c in _VOWELS for c in letters)


def _glued_in(texts: Iterable[str]) -> set[str]:
    return {token.casefold() for text in texts for token in _SOURCE_GLUED.findall(text)}


def _respace(text: str, source_texts: Sequence[str]) -> str:
    """Put the space back in "binnen2-3 dagen", leave "RAL7016", "mp3" and sources' own words."""
    known: set[str] | None = None

    def fix(token: str) -> str:
        nonlocal known
        if "://" in token or "@" in token or "`" in token or token.startswith("www."):
            return token
        match = _GLUED.fullmatch(token)
        if match is None or not _is_word(match["word"]):
            return token
        if known is None:
            known = _glued_in(source_texts)
        if (match["word"] + match["digits"]).casefold() in known:
            return token  # written so in the sources: a name like "trail2", not a slip
        return f"{match['lead']}{match['word']} {match['number']}{match['trail']}"

    lines = text.split("\n")
    in_code = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            in_code = not in_code
        elif not in_code:
            lines[i] = re.sub(r"\S+", lambda m: fix(m.group()), line)
    return "\n".join(lines)


# -- whitespace -------------------------------------------------------------------------


def _tidy(text: str) -> str:
    lines = []
    for line in text.split("\n"):
        line = re.sub(r"(?<=\S)[ \t]{2,}", " ", line)
        line = re.sub(r"[ \t]+(?=[.,](?:\s|$))", "", line)
        lines.append(line.rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
