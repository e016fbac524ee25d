"""The answerer without an LLM: the sentences of the best page that answer the question, cited.

How an answer is chosen, in order:

1. Every source is cut into quotable pieces: paragraph sentences, list items ("Price:
   €169.95" from a definition list) and table rows (with their column headers), each knowing
   its heading and the list or table it belongs to.
2. Each piece is scored: meaning (the encoder's similarity to the question, heading included),
   the question's key words it shares (the visitor's own last words count double, so "and
   Belgium?" picks Belgium's row), the kind of fact the question wants (a price, a number of
   days, a time) being present, and a penalty for filler that only announces content ("Below
   you can see ...") or restates the question.
3. One page answers: the page whose best piece scores highest (the product named in the
   question, and the page the visitor is on, count in its favour). Pieces of other pages are
   never mixed in, unless the question compares things.
4. From that page: the best piece, the rows of its table or list that the question singles
   out (or the whole short table when it asks for all of it), and close runners-up that add
   something; never the same sentence twice.
5. A yes/no question gets "Yes." or "No." where the quote settles it, and "No, X is not among
   them." when X is missing from a list that answers the question's topic.
6. Content in another language than the visitor's is announced in one sentence in theirs.
"""

from __future__ import annotations

import bisect
import functools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from core.answer.phrases import deferral, language_name, phrase
from core.answer.places import country, region_holds
from core.answer.question import (
    Question,
    fold,
    name_found,
    numeral,
    stem,
    wanted_kinds,
    words,
)
from core.knowledge.pieces import LABELLED, Sentence, digest, piece_text, split_sentences
from core.ports import Embedder
from core.store.piece_vectors import PieceVectors

__all__ = [
    "Evidence",
    "ExtractiveAnswer",
    "Passage",
    "Sentence",
    "extractive_answer",
    "piece_vectors",
    "split_sentences",
    "subject_of",
]

log = logging.getLogger(__name__)

# Two pieces this close in meaning say the same thing; the answer keeps one.
NEAR_DUPLICATE = 0.9
# Runners-up this far below the best piece add noise, not answers.
RELATIVE_MARGIN = 0.08
# ... unless they hold more of the visitor's own words and the kind of fact asked for.
WIDER_MARGIN = 0.25
FOCUS_GAIN = 0.1
MAX_ROWS = 8  # a table or list longer than this is quoted by its matching rows only
KEY_WORD_WEIGHT = 0.6
TITLE_WORD_SHARE = 0.5
COGNATE_SHARE = 0.6  # of the shorter word's letters, shared from the start
HEADING_SHARE = 0.8  # a key word only in the piece's heading
REGION_MATCH = 0.8  # "Other EU countries" for "Austria": the row, though not by name
WANTED_FACT_WEIGHT = 0.35
FILLER_PENALTY = 0.25
NAMED_PAGE_BONUS = 0.1
CURRENT_PAGE_BONUS = 0.1
# A question that points at what the visitor is looking at ("is this one waterproof?") is
# about the page they are on, far more than about the best match elsewhere.
POINTED_PAGE_BONUS = 0.4
RANK_BONUS = 0.03  # per place in the retrieval order, best first
# Pages in the visitor's language first; else the site's own (default) language.
LANGUAGE_BONUS = 0.06
# A question in a source (an FAQ entry) this close to the visitor's passes its match on to
# the answer that follows it.
FAQ_QUESTION_SIMILARITY = 0.55
# An entry (a page's title, or a heading that asks a question) is the visitor's question when
# they share this share of their words (Dice) or the encoder puts them this close: its page
# answers, from that section.
ENTRY_WORDS = 0.85
ENTRY_SIMILARITY = 0.9
ENTRY_BONUS = 0.5
# A sentence that holds another source's title of at least this many words points at that
# source ("See 'Where can I get tested?' for test sites"): it is no answer itself.
POINTER_WORDS = 4


@dataclass(frozen=True, slots=True)
class Passage:
    """One numbered source as the answerer sees it."""

    title: str
    text: str
    language: str | None = None
    current: bool = False  # the page the visitor is on
    page_id: int | None = None  # the indexed page it comes from: its pieces' vectors are stored


@dataclass(frozen=True, slots=True)
class ExtractiveAnswer:
    text: str
    citations: tuple[int, ...]  # 1-based source numbers, in order of first citation
    answered: bool
    evidence: Evidence = field(default_factory=lambda: Evidence())


@dataclass(frozen=True, slots=True)
class Evidence:
    """How well the chosen quote answers, for the confidence estimate."""

    similarity: float = 0.0  # the encoder's similarity of the best piece
    score: float = 0.0  # the best piece's full score
    coverage: float = 0.0  # share of the question's key words found on the chosen page
    names_missing: float = 0.0  # share of the question's names found nowhere in the sources
    wanted_found: bool = False  # the kind of fact asked for is in the quote
    other_language: bool = False
    quote_coverage: float = 0.0  # share of the visitor's own key words in the quote itself
    page_margin: float = 0.0  # how far the answering page leads the next one
    faq: bool = False  # the quote answers an FAQ entry like the question
    unknown: float = 0.0  # share of the visitor's own key words found in no source at all
    # The encoder's similarity of the question to the answering page's title (or the question
    # heading it answers under), and how far it leads the other sources' best: a question is
    # often one of the site's own questions in other words, in any language.
    entry_similarity: float = 0.0
    entry_lead: float = 0.0


# Kinds of fact, as they look in a sentence.
_FACTS: dict[str, re.Pattern[str]] = {
    "price": re.compile(
        r"(€|\$|£|\bEUR\b|\bUSD\b|\bCHF\b)\s?\d|\d\s?(€|EUR|euro)|\b(free|free of charge|"
        r"gratis|kosteloos|kostenlos|gratuit|gratuito)\b",
        re.I,
    ),
    "availability": re.compile(
        r"\b(in stock|out of stock|sold out|available|op voorraad|uitverkocht|leverbaar|"
        r"auf lager|ausverkauft|lieferbar|verfügbar|en stock|épuisé|disponible|agotado|"
        r"disponibile|esaurito|instock|outofstock)\b",
        re.I,
    ),
    "duration": re.compile(
        r"\b(every|elke|iedere|alle|jede[nrs]?|chaque|tous les|cada|ogni)\b|"
        r"\d\s*(?:[-–]\s*\d+\s*)?(?:working |business )?(days?|weeks?|hours?|months?|years?|"
        r"maand(en)?|jaar|jaren|monate?n?|jahre?n?|mois|ans|années|mes(es)?|años?|mesi|anni|"
        r"werkdag(en)?|"
        r"dag(en)?|we(e)?k(en)?|uur|werktage?n?|tage?n?|wochen?|stunden?|jours?|semaines?|"
        r"heures?|días?|semanas?|horas?|giorni|settimane|ore)\b|next (working|business) day|"
        r"volgende werkdag|n[äa]chste[nr]? werktag|same day|dezelfde dag|am selben tag|"
        r"jour ouvrable suivant|día hábil siguiente|giorno lavorativo successivo",
        re.I,
    ),
    # times: "15:00", "15.00 uur", "3 pm" (a bare "4.95" is a price, not a time)
    "hours": re.compile(
        r"\b\d{1,2}:\d{2}\b|\b\d{1,2}\.\d{2}\s?(uur|Uhr|h)\b|\b\d{1,2}\s?(am|pm|uur|Uhr)\b", re.I
    ),
    "date": re.compile(
        r"\b(1[0-9]\d\d|20\d\d)\b|\b\d{1,2}:\d{2}\b|\b(january|february|march|april|may|"
        r"june|july|august|september|october|november|december|monday|tuesday|wednesday|"
        r"thursday|friday|saturday|sunday|januari|februari|maart|mei|juni|juli|augustus|"
        r"oktober|maandag|dinsdag|woensdag|donderdag|vrijdag|zaterdag|zondag|januar|februar|"
        r"märz|juni|juli|oktober|dezember|montag|dienstag|mittwoch|donnerstag|freitag|samstag|"
        r"sonntag|janvier|février|mars|avril|mai|juin|juillet|août|septembre|octobre|"
        r"novembre|décembre|lundi|mardi|mercredi|jeudi|vendredi|samedi|dimanche|enero|"
        r"febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|octubre|noviembre|diciembre|"
        r"lunes|martes|miércoles|jueves|viernes|sábado|domingo|gennaio|febbraio|aprile|"
        r"maggio|giugno|luglio|settembre|ottobre|dicembre|lunedì|martedì|mercoledì|giovedì|"
        r"venerdì|sabato|domenica)\b",
        re.I,
    ),
    "number": re.compile(r"\d"),
    "measure": re.compile(
        r"\d[\d.,]*\s?(km|m|cm|mm|kilomet\w*|met(er|re)s?|metros|mètres|metri|miles?|feet|"
        r"ft|kilómetros|chilometri)\b",
        re.I,
    ),
    "place": re.compile(
        r"(?<=\s)(in|at|near|from|to|te|bij|naar|uit|im|in|am|aus|nach|en|à|"
        r"au|aux|de|a|da|di)\s+(der |den |die |the |de |la |le |les )?[A-ZÀ-Þ]\w+"
    ),
    "temperature": re.compile(
        r"[-−–]?\d+\s?°\s?[CF]?|\d+\s?(degrees|graden|Grad|degrés|grados)", re.I
    ),
    "person": re.compile(r"(?<!^)(?<![.!?]\s)\b[A-ZÀ-Þ][a-zß-ÿ]+\s+[A-ZÀ-Þ][a-zß-ÿ]+"),
    "size": re.compile(
        r"\b(EU|UK|US)\W{0,3}\d|\d\s?(cm|mm|l|liters?|litres?|litern?|litri|litros)\b|\((cm|mm)\)|\b(XS|S|M|L|XL|XXL)\b"
    ),
    "weight": re.compile(r"\d\s?(g|kg|gram|grams|gramm)\b", re.I),
    "code": re.compile(r"\b[A-Z]{2,}-?\d{2,}|\b\d{6,}\b"),
    "contact": re.compile(r"@\w|\+?\d[\d\s()-]{7,}\d|\b\d{4}\s?[A-Z]{2}\b"),
    "colour": re.compile(r"\b(colou?rs?|kleuren?|farben?|couleurs?|colores|colori)\b", re.I),
}
# "We charge no fees", "geen transactiekosten": settles whether something costs extra.
_NO_COST = re.compile(
    r"\b(no|never|without|geen|zonder|keine?n?|ohne|sans|aucuns?|sin|ningún|senza|nessun)\b"
    r"[^.;]{0,40}?(costs?|fees?|charges?|\w*kosten|\w*gebühren|frais|gastos|costi)\b",
    re.I,
)
# Sentences that announce content rather than give it ("Below you can see ...").
_FILLER = re.compile(
    r"\b(below|following|hereunder|on this page|see the table|as follows|read on|"
    r"hieronder|onderstaande|volgende overzicht|op deze pagina|lees verder|"
    r"unten|folgenden|nachfolgend|auf dieser seite|hier siehst du|hier sehen sie|hier finden sie|"
    r"hier erfährst du|hier erfahren sie|hier lees je|lees je hier|here you can read|"
    r"you can read here|ici,? vous|aquí (puedes|encontrarás)|qui (puoi|trovi)|"
    r"ci-dessous|suivant|sur cette page|a continuación|siguiente|en esta página|"
    r"qui sotto|seguente|in questa pagina)\b",
    re.I,
)
# States that answer "no" wherever they stand in the quote ("Availability: Sold out").
_NEGATIVE_STATE = re.compile(
    r"\b(sold out|out of stock|unavailable|uitverkocht|niet leverbaar|ausverkauft|"
    r"nicht lieferbar|épuisé|agotado|esaurito|outofstock)\b",
    re.I,
)
# Words that negate what stands next to them ("is not waterproof", "ohne Zusatzkosten").
_NEGATION_WORDS = frozenset(
    """not no never cannot can't don't doesn't isn't aren't won't without niet geen nooit
    zonder nicht kein keine keinen nie ohne pas jamais aucun aucune sans nunca ningún
    ninguna sin non mai nessun nessuna senza""".split()  # noqa: SIM905
)
# How far (in words) a negation may stand from a word of the question to negate it.
NEGATION_REACH = 5


def subject_of(title: str) -> str:
    """What a page is about, from its title: "Fjellsti Mid WP – Hiking boot | Shop" ->
    "Fjellsti Mid WP" (the site's name and the tagline go)."""
    main = re.split(r"\s+[|·]\s+", title.strip())[0]
    main = re.split(r"\s+[–—-]\s+", main)[0]
    return re.sub(r"\s*\([^)]*\)\s*$", "", main).strip()


def _cite(text: str, source: int) -> str:
    text = text.rstrip()
    marker = f"[{source + 1}]"
    if text[-1:] in ".!?":
        return f"{text[:-1].rstrip()} {marker}{text[-1]}"
    return f"{text} {marker}."


def _compose(picked: Sequence[Sentence], subject: str) -> list[str]:
    """The quote: sentences as they are, the rows of one table or list joined into one
    sentence ("Monday: 12:00–18:00; Tuesday: ..."), each cited once."""
    parts: list[str] = []
    group: list[Sentence] = []

    def flush() -> None:
        if not group:
            return
        if len(group) > 1 and all(len(s.cells) == 2 and all(s.cells) for s in group):
            # a whole two-column table reads as "Monday: 12:00–18:00; Tuesday: ..."
            text = "; ".join(f"{s.cells[0]}: {s.cells[1]}" for s in group)
            text = f"{group[0].heading} – {text}" if group[0].heading else text
        else:
            text = "; ".join(s.text.rstrip(" .;") for s in group)
        first = group[0]
        if (
            subject
            and not first.header
            and LABELLED.match(text)
            and fold(subject) not in fold(text)
        ):
            text = f"{subject} – {text}"  # "Price: €169.95" alone does not say of what
        parts.append(_cite(text, first.source))
        group.clear()

    for sentence in picked:
        if group and (sentence.block < 0 or sentence.block != group[-1].block):
            flush()
        group.append(sentence)
        if sentence.block < 0:
            flush()
    flush()
    return parts


_RANGE = re.compile(
    r"(\d+(?:[.,]\d+)?)\s*(?:–|-|—|to|tot|bis|à|a|al)\s*(\d+(?:[.,]\d+)?)", re.IGNORECASE
)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "."))
    except ValueError:
        return None


def _ranges(text: str) -> list[tuple[float, float]]:
    """Numeric ranges in a text ("EU 43–46", "39 to 42"), low end first."""
    out = []
    for match in _RANGE.finditer(text):
        low, high = _number(match.group(1)), _number(match.group(2))
        if low is not None and high is not None and low < high:
            out.append((low, high))
    return out


def _cognate(term: str, plain: frozenset[str]) -> bool:
    """A word of ``plain`` is ``term`` in another language: they share most of the shorter
    one's letters from the start ("belgie", "belgium"), not just a first part ("wassersaule",
    "wasserdicht")."""
    for word in plain:
        if word[:5] != term[:5]:
            continue
        shared = next(
            (i for i, (a, b) in enumerate(zip(word, term, strict=False)) if a != b),
            min(len(word), len(term)),
        )
        if shared >= COGNATE_SHARE * min(len(word), len(term)):
            return True
    return False


_WEEKDAYS = frozenset(
    fold(day)
    for day in """monday tuesday wednesday thursday friday saturday sunday maandag dinsdag
    woensdag donderdag vrijdag zaterdag zondag montag dienstag mittwoch donnerstag freitag
    samstag sonntag lundi mardi mercredi jeudi vendredi samedi dimanche lunes martes miércoles
    jueves viernes sábado domingo lunedì martedì mercoledì giovedì venerdì sabato
    domenica""".split()  # noqa: SIM905
)


def _sort_of(term: str) -> str | None:
    """What a follow-up may put in an earlier question's place: a country, a day, a number."""
    if country(term) is not None:
        return "country"
    if term in _WEEKDAYS:
        return "day"
    return "number" if numeral(term) is not None else None


# What a text's words are, worked out once per text: the same pages are read turn after turn.


@functools.lru_cache(maxsize=50_000)
def _folded(text: str) -> frozenset[str]:
    """A text's words, folded."""
    return frozenset(fold(w) for w in words(text))


@dataclass(frozen=True, slots=True)
class _Forms:
    plain: frozenset[str]  # folded
    stems: frozenset[str]
    prefixes: frozenset[str]  # the first five letters
    ordered: tuple[str, ...]  # plain, sorted: the words that begin with a term, by bisection
    numerals: frozenset[str]  # the numbers written ("3", "drie": "3")

    def begins(self, term: str) -> bool:
        """Whether a word begins with ``term``."""
        at = bisect.bisect_left(self.ordered, term)
        return at < len(self.ordered) and self.ordered[at].startswith(term)


@functools.lru_cache(maxsize=50_000)
def _word_forms(text: str, language: str) -> _Forms:
    plain = _folded(text)
    return _Forms(
        plain,
        frozenset(stem(w, language) for w in plain),
        frozenset(w[:5] for w in plain),
        tuple(sorted(plain)),
        frozenset(n for w in plain if (n := numeral(w)) is not None),
    )


@functools.lru_cache(maxsize=50_000)
def _fact_kinds(text: str) -> frozenset[str]:
    """The kinds of fact a text holds by its shape ("€249.00": price)."""
    return frozenset(kind for kind, pattern in _FACTS.items() if pattern.search(text))


_named_kinds = functools.lru_cache(maxsize=10_000)(wanted_kinds)


class _Matcher:
    """Whether a piece of text contains a question's key words, by stem or by a shared
    beginning across languages ("België", "Belgium", "Belgien")."""

    def __init__(self, question: Question) -> None:
        self.language = question.language
        self.focus = set(question.focus)
        # "...shipping to Belgium? what about Germany": Germany takes Belgium's place
        replacing = {_sort_of(t) for t in self.focus} - {None}
        self.terms = tuple(
            t for t in question.terms if t in self.focus or _sort_of(t) not in replacing
        )
        self.stems = {t: stem(t, self.language) for t in self.terms}
        self.numerals = {t: numeral(t) for t in self.terms}
        self.numbers = {t: _number(t) for t in self.terms}
        self.name_words = {fold(w) for name in question.names for w in words(name)}
        # a heading is asked about for each of its pieces
        self._found: dict[tuple[str, ...], dict[str, float]] = {}

    def found(self, *parts: str) -> dict[str, float]:
        """Key word -> 1.0 for the same stem, 0.7 for a number inside a range ("44" in
        "43–46"), 0.6 for a shared beginning; in the text the parts make joined by spaces
        (the words of each part are known from earlier turns, their joining is new)."""
        known = self._found.get(parts)
        if known is None:
            known = self._found[parts] = self._find(parts)
        return dict(known)

    def _find(self, parts: tuple[str, ...]) -> dict[str, float]:
        forms = [_word_forms(part, self.language) for part in parts]
        ranges: list[tuple[float, float]] | None = None
        out = {}
        for term in self.terms:
            stemmed = self.stems[term]
            digits = self.numerals[term]
            if any(term in f.plain or stemmed in f.stems for f in forms):
                out[term] = 1.0
            elif digits is not None and any(digits in f.numerals for f in forms):
                out[term] = 1.0  # "3 pack" and "a pack of three"
            elif (
                len(term) >= 6
                and any(term[:5] in f.prefixes and _cognate(term, f.plain) for f in forms)
            ) or (len(term) >= 4 and any(f.begins(term) for f in forms)):
                out[term] = 0.6  # a cognate, or the first part of a compound ("Raten" in
                # "Ratenzahlung")
            elif (number := self.numbers[term]) is not None:
                ranges = _ranges(" ".join(parts)) if ranges is None else ranges
                if any(low <= number <= high for low, high in ranges):
                    out[term] = 0.7  # inside a range counts less than the number itself
        return out

    def weight(self, term: str) -> float:
        return 2.0 if term in self.focus else 1.0


def _key_word_scores(
    matcher: _Matcher, sentences: Sequence[Sentence], titles: Sequence[str]
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Per piece: the share of the question's key words it holds, the rarer among the
    pieces counting more (a country in one row of many), and the share of the visitor's own
    key words it holds. Words of the page's title do not count: every piece of the
    Stormvang 3L page is about the Stormvang 3L, the question is which one says its price.
    Only the names of the question are left out so: "store" in "Contact and store" still
    tells the store's opening hours from other hours."""
    on_title = [set(matcher.found(title)) for title in titles]
    subjects = [fold(subject_of(title)) for title in titles]

    def section(sentence: Sentence) -> str:
        # the page's main heading repeats its title: it sets no piece apart
        own = fold(sentence.heading) != subjects[sentence.source]
        return " ".join([sentence.heading if own else "", *sentence.header])

    def weigh(sentence: Sentence, term: str, value: float) -> float:
        if term not in on_title[sentence.source]:
            return value
        if term in matcher.name_words:
            return 0.0  # the page is about the product: no piece says more of it
        # the page's own topic tells little about which piece answers, unless the piece's
        # section or column names it too ("Store opening hours" on "Contact and store")
        return value if term in matcher.found(section(sentence)) else value * TITLE_WORD_SHARE

    def held(sentence: Sentence) -> dict[str, float]:
        # a word of the piece itself says more than one of its section's heading
        own = matcher.found(sentence.text)
        under = matcher.found(sentence.heading)
        merged = {t: max(own.get(t, 0.0), HEADING_SHARE * under.get(t, 0.0)) for t in own | under}
        return {t: weigh(sentence, t, v) for t, v in merged.items()}

    found = [held(s) for s in sentences]
    if not matcher.terms:
        zeros = np.zeros(len(sentences), dtype=np.float32)
        return zeros, zeros
    count = {t: sum(t in f for f in found) for t in matcher.terms}
    for term in matcher.terms:
        # a country a page does not name is answered there by the row of its region
        # ("Austria" by "Other EU countries")
        if (code := country(term)) is not None:
            naming = {s.source for s, f in zip(sentences, found, strict=True) if term in f}
            for piece, sentence in zip(found, sentences, strict=True):
                if sentence.source not in naming and region_holds(
                    code, f"{sentence.heading} {sentence.text}"
                ):
                    piece[term] = REGION_MATCH
            count[term] = sum(term in f for f in found)
    n = len(sentences)
    weight = {t: matcher.weight(t) * float(np.log((n + 1) / (count[t] + 1)) + 0.5) for t in count}
    total = sum(weight.values()) or 1.0
    focus_total = sum(weight[t] for t in matcher.focus if t in weight) or 1.0
    shares = [sum(weight[t] * v for t, v in f.items()) / total for f in found]
    focus = [sum(weight[t] * v for t, v in f.items() if t in matcher.focus) / focus_total
             for f in found]  # fmt: skip
    return np.array(shares, dtype=np.float32), np.array(focus, dtype=np.float32)


def _context(sentence: Sentence) -> str:
    """What a piece is under: its heading and its table's columns."""
    return " ".join([sentence.heading, *sentence.header])


def _wanted(question: Question, text: str, heading: str = "") -> bool:
    """The piece holds the kind of fact asked for: by its own shape ("€249.00", "2-3
    days"), or a number under a heading that names the kind ("Gewicht", "Opening hours")."""
    if question.wants & _fact_kinds(text):
        return True
    if question.yes_no and "price" in question.wants and _NO_COST.search(text):
        return True  # "Do you charge extra for PayPal?" - "We never charge a fee"
    return bool(heading) and _has_digit(text) and bool(question.wants & _named_kinds(heading))


def _filler(question: Question, sentence: Sentence, matcher: _Matcher) -> bool:
    """Announces content ("Below you can see how long delivery takes") or restates the
    question without a fact of its own."""
    if _announces(sentence.text):
        return True
    own = _folded(sentence.text)
    return len(own) <= 12 and len(own - set(matcher.terms)) <= 2 and not question.yes_no


@functools.lru_cache(maxsize=50_000)
def _announces(text: str) -> bool:
    text = text.rstrip()
    return text.endswith(":") or bool(_FILLER.search(text) and not re.search(r"\d", text))


@functools.lru_cache(maxsize=50_000)
def _has_digit(text: str) -> bool:
    return any(c.isdigit() for c in text)


def _questions_point_at_answers(
    sentences: Sequence[Sentence], similarity: NDArray[np.float32], scores: NDArray[np.float32]
) -> NDArray[np.float32]:
    """A question in a source (an FAQ entry) is never the answer. When it is the visitor's
    question in other words, its score passes to the sentence that follows it in the same
    source, which usually is the answer; a question merely on the same topic passes nothing."""
    scores = scores.copy()
    for index, sentence in enumerate(sentences):
        if not sentence.text.rstrip().endswith("?"):
            continue
        following = index + 1
        if (
            similarity[index] >= FAQ_QUESTION_SIMILARITY
            and following < len(sentences)
            and sentences[following].source == sentence.source
        ):
            scores[following] = max(scores[following], scores[index])
        scores[index] = -1.0
    return scores


@dataclass(frozen=True, slots=True)
class _Scored:
    sentences: list[Sentence]
    vectors: NDArray[np.float32]
    similarity: NDArray[np.float32]
    key_words: NDArray[np.float32]
    focus: NDArray[np.float32]
    scores: NDArray[np.float32]
    wanted: NDArray[np.float32]


async def piece_vectors(
    embedder: Embedder,
    texts: Sequence[str],
    pages: Sequence[int | None],
    stored: PieceVectors | None,
) -> NDArray[np.float32]:
    """The vectors of the pieces' texts: those stored at ingest, the rest encoded now (and
    stored for the next turn when their page is known)."""
    rows = np.empty((len(texts), embedder.dimension), dtype=np.float32)
    keys: dict[int, tuple[int, bytes]] = {}  # piece -> its key, when its page is indexed
    if stored is not None:
        keys = {i: (page, digest(texts[i])) for i, page in enumerate(pages) if page is not None}
        found = await stored.fetch(embedder.name, embedder.dimension, list(set(keys.values())))
        for i, key in list(keys.items()):
            if key in found:
                rows[i] = found[key]
                del keys[i]
    missing = [i for i in range(len(texts)) if stored is None or i in keys or pages[i] is None]
    if not missing:
        return rows
    unique = list(dict.fromkeys(texts[i] for i in missing))
    fresh = dict(zip(unique, await embedder.embed(unique), strict=True))
    for i in missing:
        rows[i] = fresh[texts[i]]
    if stored is not None and keys:
        first = {key: i for i, key in keys.items()}  # a text twice on one page: stored once
        await stored.keep(embedder.name, list(first), rows[list(first.values())])
    return rows


async def _score(
    question: Question,
    sentences: list[Sentence],
    passages: Sequence[Passage],
    embedder: Embedder,
    matcher: _Matcher,
    stored: PieceVectors | None,
) -> _Scored:
    texts = [piece_text(s) for s in sentences]
    asked = await embedder.embed([question.text])
    pages = [passages[s.source].page_id for s in sentences]
    rows = await piece_vectors(embedder, texts, pages, stored)
    titles = [p.title for p in passages]
    similarity = (rows @ asked[0]).astype(np.float32)
    key_words, focus = _key_word_scores(matcher, sentences, titles)
    # a labelled fact of the wanted kind ("Price: €249.00") is the answer itself
    wanted = np.array(
        [_wanted(question, s.text, _context(s)) * (1.5 if LABELLED.match(s.text) else 1.0)
         for s in sentences],
        dtype=np.float32,
    )  # fmt: skip
    filler = np.array([_filler(question, s, matcher) for s in sentences], dtype=np.float32)
    scores = (
        similarity
        + KEY_WORD_WEIGHT * key_words
        + WANTED_FACT_WEIGHT * wanted
        - FILLER_PENALTY * filler
    ).astype(np.float32)
    scores = _questions_point_at_answers(sentences, similarity, scores)
    return _Scored(sentences, rows, similarity, key_words, focus, scores, wanted)


def _page_scores(
    question: Question,
    passages: Sequence[Passage],
    scored: _Scored,
    fallback_languages: Sequence[str] = (),
) -> NDArray[np.float32]:
    """Each page's claim to answer: its best piece (of the kind of fact asked for, when the
    question wants one: a page without it pays WANTED_FACT_WEIGHT), plus the product named in
    the question, the page the visitor is on, and the visitor's (or the site's) language."""
    best = np.full(len(passages), -1.0, dtype=np.float32)
    has_wanted = np.zeros(len(passages), dtype=bool)
    for sentence, score, wanted in zip(scored.sentences, scored.scores, scored.wanted, strict=True):
        if question.wants and not wanted and has_wanted[sentence.source]:
            continue
        if question.wants and wanted and not has_wanted[sentence.source]:
            has_wanted[sentence.source] = True
            best[sentence.source] = score
        else:
            best[sentence.source] = max(best[sentence.source], score)
    if question.wants:
        best[(~has_wanted) & (best >= 0)] -= WANTED_FACT_WEIGHT
    for index, passage in enumerate(passages):
        if best[index] < 0:
            continue
        named = fold(passage.title) + " " + fold(passage.text[:300])
        if any(name_found(name, named) for name in question.names):
            best[index] += NAMED_PAGE_BONUS
        if passage.current:
            best[index] += POINTED_PAGE_BONUS if question.points else CURRENT_PAGE_BONUS
        best[index] += RANK_BONUS * max(0, 3 - index)
        if passage.language:
            language = passage.language.split("-")[0]
            if language == question.language.split("-")[0]:
                best[index] += LANGUAGE_BONUS
            elif language in fallback_languages:
                best[index] += LANGUAGE_BONUS / 2
    return np.maximum(best, -1.0)


@dataclass(frozen=True, slots=True)
class _Entries:
    """How the sources' own questions compare with the visitor's: per source, the best
    similarity of its title or of a heading that asks a question; and the source (and its
    section) whose entry is the visitor's question itself, when exactly one source has it."""

    similarity: NDArray[np.float32]
    exact: int | None = None
    heading: str | None = None


def _dice(a: str, b: str) -> float:
    x, y = _folded(a), _folded(b)
    return 2 * len(x & y) / (len(x) + len(y)) if x and y else 0.0


async def _entries(
    question: Question,
    passages: Sequence[Passage],
    sentences: Sequence[Sentence],
    embedder: Embedder,
    stored: PieceVectors | None,
) -> _Entries:
    named: dict[tuple[int, str], str | None] = {}  # (source, text) -> its heading, if one
    for index, passage in enumerate(passages):
        if passage.title.strip():
            named.setdefault((index, passage.title.strip()), None)
    for sentence in sentences:
        if sentence.heading.rstrip().endswith("?"):
            named.setdefault((sentence.source, sentence.heading.strip()), sentence.heading)
    similarity = np.zeros(len(passages), dtype=np.float32)
    if not named:
        return _Entries(similarity)
    keys = list(named)
    # Stored at ingest with the pieces (`core.knowledge.pieces.entry_texts`).
    vectors = await piece_vectors(
        embedder, [text for _, text in keys], [passages[i].page_id for i, _ in keys], stored
    )
    asked = (await embedder.embed([question.text]))[0]
    close = (vectors @ asked).astype(np.float32)
    exact: dict[int, tuple[float, str | None]] = {}
    for (source, text), value in zip(keys, close, strict=True):
        similarity[source] = max(similarity[source], float(value))
        asks = _dice(text, question.text) >= ENTRY_WORDS or value >= ENTRY_SIMILARITY
        if asks and (source not in exact or value > exact[source][0]):
            exact[source] = (float(value), named[(source, text)])
    if len(exact) != 1:
        return _Entries(similarity)  # none, or several sources ask it: nothing is settled
    [(source, (_, heading))] = exact.items()
    return _Entries(similarity, source, heading)


def _points_elsewhere(sentence: Sentence, passages: Sequence[Passage]) -> bool:
    """The sentence names another source's title: it points there, it does not answer."""
    return any(
        index != sentence.source
        and len(words(passage.title)) >= POINTER_WORDS
        and _contains_words(sentence.text, passage.title.rstrip("?.!: "))
        for index, passage in enumerate(passages)
    )


def _answers_a_question(scored: _Scored, index: int) -> bool:
    """The sentence sits in the answer of an FAQ entry: under a heading that is a question,
    or right after a question like the visitor's."""
    sentences = scored.sentences
    sentence = sentences[index]
    if sentence.block >= 0 or sentence.paragraph < 0:
        return False
    if sentence.heading.rstrip().endswith("?"):
        return True
    before = sentences[index - 1] if index > 0 else None
    return (
        before is not None
        and before.source == sentence.source
        and before.text.rstrip().endswith("?")
        and scored.similarity[index - 1] >= FAQ_QUESTION_SIMILARITY
    )


def _asks_for_block(scored: _Scored, best: int, members: Sequence[int], matcher: _Matcher) -> bool:
    """The question names what the whole table or list is about ("Store opening hours?"):
    its heading holds most of the question's key words, and no row stands out."""
    if scored.key_words[best] > min(scored.key_words[i] for i in members) + 1e-6:
        return False
    heading = scored.sentences[best].heading
    if not heading or not matcher.terms:
        return False
    return sum(matcher.found(heading).values()) >= 0.5 * len(matcher.terms)


def _choose(
    question: Question,
    scored: _Scored,
    pages: set[int],
    max_sentences: int,
    floor: float,
    matcher: _Matcher,
) -> list[int]:
    """The pieces of the answering page(s): the best, the rows of its block the question
    singles out (or all of a short block asked for as a whole), then close runners-up."""
    candidates = [i for i, s in enumerate(scored.sentences) if s.source in pages]
    wanted = [i for i in candidates if scored.wanted[i] and scored.scores[i] >= floor]
    if question.wants and wanted and not question.yes_no:
        # "How much is it?" is answered by a price when the page has one; a table or list
        # that holds the kind of fact stays whole (a row may say it in words: "next day")
        tables = {scored.sentences[i].block for i in wanted if scored.sentences[i].header}
        candidates = [
            i for i in candidates if scored.wanted[i] or scored.sentences[i].block in tables
        ]
    order = sorted(candidates, key=lambda i: -scored.scores[i])
    if not order or scored.scores[order[0]] < floor:
        return []
    best = order[0]
    chosen = [best]
    block = scored.sentences[best].block
    if block >= 0:
        members = [i for i in candidates if scored.sentences[i].block == block]
        # the rows holding most of the visitor's own words ("40" inside "39–42" of one row)
        top = max(scored.focus[i] for i in members)
        low = min(scored.focus[i] for i in members)
        # (a word of the block's heading in one row's own text does not single it out)
        singled = [i for i in members if top - low > 0.25 and scored.focus[i] >= top - 1e-6]
        if singled and len(singled) < len(members):
            chosen = sorted(singled, key=lambda i: -scored.scores[i])[:3]
            return sorted(chosen)  # the visitor's words chose these rows: nothing else
        elif len(members) <= MAX_ROWS and _asks_for_block(scored, best, members, matcher):
            chosen = members  # nothing singles a row out: the question asks for all of it
        elif (
            len(members) <= MAX_ROWS
            and not scored.sentences[best].header  # a list, not a table's rows
            and len(kin := [i for i in members if scored.wanted[i]]) > 1
            and scored.wanted[best]
        ):
            # several rows give the fact asked for (a comfort, a limit and an extreme
            # temperature): all of them, in the page's order, which puts the everyday first
            chosen = kin
    if _answers_a_question(scored, best):
        # an FAQ entry matched: its whole answer paragraph is the answer
        here = scored.sentences[best]
        chosen = [
            i for i in candidates
            if scored.sentences[i].source == here.source
            and scored.sentences[i].paragraph == here.paragraph
            and not scored.sentences[i].text.rstrip().endswith("?")
        ][:max_sentences]  # fmt: skip
    if len(chosen) == 1:
        margin = scored.scores[best] - RELATIVE_MARGIN
        wider = scored.scores[best] - WIDER_MARGIN
        for index in order[1:]:
            if len(chosen) >= max_sentences or scored.scores[index] < max(wider, floor):
                break
            # further down, only a piece with more of the visitor's own words ("3 pack":
            # "€54.95 for a pack of three" after "Price: €19.95 per pair")
            adds = scored.focus[index] > scored.focus[best] + FOCUS_GAIN
            if scored.scores[index] < margin and not (adds and scored.wanted[index]):
                continue
            if scored.wanted[best] and not scored.wanted[index]:
                continue  # the fact asked for is there: what lacks it is noise
            if block >= 0 and scored.sentences[index].block == block:
                continue  # the question's words already chose among this block's rows
            if any(
                float(scored.vectors[index] @ scored.vectors[other]) >= NEAR_DUPLICATE
                or _contains(scored.sentences[other].text, scored.sentences[index].text)
                for other in chosen
            ):
                continue
            chosen.append(index)
    return sorted(chosen)  # page order reads better than score order


def _contains(a: str, b: str) -> bool:
    x, y = " ".join(fold(a).split()), " ".join(fold(b).split())
    return x in y or y in x


def _contains_words(text: str, part: str) -> bool:
    """Whether ``part`` occurs in ``text`` as whole words, whatever the case and spacing."""
    return f" {' '.join(words(fold(part)))} " in f" {' '.join(words(fold(text)))} "


def _missing(question: Question, matcher: _Matcher, everything: Sequence[str]) -> str | None:
    """The one thing a yes/no question asks about that no source mentions ("Bitcoin"), or
    None when everything is mentioned or several things are missing (nothing is settled)."""
    found_anywhere = matcher.found(*everything)
    absent = [t for t in matcher.terms if t not in found_anywhere]
    if not absent:
        return None
    for name in question.names:
        own = {fold(w) for w in words(name)}
        if set(absent) <= own:
            return name
    if len(absent) != 1:
        return None
    # a single missing word is a thing only when written as a name ("bitcoin" in lower case
    # is as likely a typo as a brand; "ever" or "currently" never are)
    written = [w for w in words(question.text)[1:] if fold(w) == absent[0] and w[:1].isupper()]
    return written[0] if written else None


def _yes_no(question: Question, picked: Sequence[Sentence], matcher: _Matcher) -> str | None:
    """ "Yes." or "No." when the quote settles the question: it holds most of the question's
    own words (names aside), or the kind of fact asked for."""
    quote = " ".join(f"{s.heading} {s.text}" for s in picked)
    name_words = {fold(w) for n in question.names for w in words(n)}
    asked = [t for t in matcher.terms if t not in name_words]
    held = matcher.found(quote)
    covered = sum(held.get(t, 0.0) for t in asked)
    if asked and covered <= 0.5 * len(asked) and not _wanted(question, quote):
        return None
    if _NEGATIVE_STATE.search(quote):
        return phrase("no", question.language)
    said = words(quote)
    negations = [i for i, w in enumerate(said) if fold(w) in _NEGATION_WORDS]
    if not negations:
        return phrase("yes", question.language)
    # "The shoe is not waterproof": no. "Pay on account: ... without extra costs": the
    # negation is about something else; the quote speaks for itself, without a verdict.
    terms = [i for i, w in enumerate(said) if set(matcher.found(w)) & set(asked)]
    near = any(abs(n - t) <= NEGATION_REACH for n in negations for t in terms)
    return phrase("no", question.language) if near else None


# A sentence that opens with its own yes or no.
_VERDICT = re.compile(r"^\W*(yes|no|ja|nee|nein|oui|non|sí|si)\b", re.IGNORECASE)


def _best_list(scored: _Scored, page: int, floor: float, *, by_meaning: bool = False) -> list[int]:
    """The members of the page's list or table that best matches the question: by its best
    member's score, or (``by_meaning``) by its members' closeness in meaning alone, since a
    list of short names ("PayPal", "Apple Pay") shares no words with "which payment methods
    are there?" and scores as filler, while its heading and items mean what was asked."""
    blocks: dict[int, list[int]] = {}
    for i, sentence in enumerate(scored.sentences):
        if sentence.source == page and sentence.block >= 0:
            blocks.setdefault(sentence.block, []).append(i)
    values = scored.similarity if by_meaning else scored.scores
    ranked = sorted(blocks.values(), key=lambda m: -max(values[i] for i in m))
    for members in ranked:
        if 3 <= len(members) <= MAX_ROWS and max(values[i] for i in members) >= floor:
            return members
    return []


async def extractive_answer(
    question: Question,
    passages: Sequence[Passage],
    embedder: Embedder,
    *,
    contact_route: str,
    max_sentences: int = 3,
    min_similarity: float = 0.3,
    fallback_languages: Sequence[str] = (),
    said: str | None = None,
    stored: PieceVectors | None = None,
) -> ExtractiveAnswer:
    """Pieces of the best page (source i cited as [i+1]) that answer ``question``; when none
    is close enough, the deferral in the question's language with the contact route.

    The answer's words are the sources' and its own phrases; the only others it may repeat
    are those in ``said``, what the visitor wrote (None: the question's text). The rest of
    the question (a page title the search query was filled in from) is never quoted.

    ``stored``: where the vectors of the passages' pieces were kept at ingest (by their
    ``page_id``); without it, or for pieces not found there, they are encoded now."""
    language = question.language
    sentences = split_sentences([p.text for p in passages])
    if not sentences or not question.text.strip():
        return ExtractiveAnswer(deferral(language, contact_route), (), answered=False)
    matcher = _Matcher(question)
    scored = await _score(question, sentences, passages, embedder, matcher, stored)
    entries = await _entries(question, passages, sentences, embedder, stored)
    for index, sentence in enumerate(sentences):
        if _points_elsewhere(sentence, passages):
            scored.scores[index] = -1.0
        elif (
            entries.heading is not None
            and sentence.source == entries.exact
            and sentence.heading == entries.heading
        ):
            scored.scores[index] += ENTRY_BONUS  # the section that asks the question answers
    page_scores = _page_scores(question, passages, scored, fallback_languages)
    # A product the question names answers from its own page when one is among the sources.
    about = [
        i for i, p in enumerate(passages)
        if page_scores[i] >= 0 and any(name_found(n, subject_of(p.title)) for n in question.names)
    ]  # fmt: skip
    holding = {scored.sentences[i].source for i in range(len(scored.sentences)) if scored.wanted[i]}
    if question.wants and not holding.intersection(about):
        about = []  # "the warranty on this one": the product's page does not say; another may
    if entries.exact is not None and page_scores[entries.exact] >= 0:
        about = [entries.exact]  # the site asks the visitor's question itself: it answers
    if about and not question.compares:
        others = [i for i in range(len(passages)) if i not in about]
        page_scores[others] = -1.0
    ranked_pages = [int(i) for i in np.argsort(-page_scores, kind="stable")]
    pages = {ranked_pages[0]}
    if question.compares and len(ranked_pages) > 1:
        pages.add(ranked_pages[1])
    chosen = _choose(question, scored, pages, max_sentences, min_similarity, matcher)
    # "Which payment methods are there?": the list, not the sentence announcing it; unless
    # the quote holds the kind of fact asked for already ("which colours?": "Colours: ...").
    listed = (
        question.lists
        and not question.yes_no
        and bool(chosen)
        and not any(scored.wanted[i] for i in chosen)
    )
    if listed and (
        members := _best_list(scored, ranked_pages[0], min_similarity / 2, by_meaning=True)
    ):
        chosen = members
    else:
        listed = False
    everything = [part for p in passages for part in (p.title, p.text)]
    # the words of the question's names found nowhere ("Q-Park" of "Q-Park Westblaak")
    name_words = [fold(w) for n in question.names for w in words(n)]
    names_unknown = (
        sum(not any(w in _folded(part) for part in everything) for w in name_words)
        / len(name_words)
        if name_words
        else 0.0
    )
    page = ranked_pages[0]
    on_page = matcher.found(passages[page].title, passages[page].text)
    coverage = sum(on_page.values()) / len(matcher.terms) if matcher.terms else 0.0
    best = max(chosen, key=lambda i: scored.scores[i]) if chosen else int(np.argmax(scored.scores))
    picked = [sentences[i] for i in chosen]
    # Across languages only names and numbers can be found word for word.
    across = _other_language(passages[page], language)
    shared = [t for t in question.focus if not across or t in matcher.name_words or t.isdigit()]
    evidence = Evidence(
        similarity=float(scored.similarity[best]),
        score=float(scored.scores[best]),
        coverage=min(1.0, coverage),
        names_missing=names_unknown,
        wanted_found=bool(picked) and any(_wanted(question, s.text) for s in picked),
        other_language=across,
        quote_coverage=_share(matcher, shared, picked) if shared else 0.5,
        page_margin=_margin(page_scores),
        faq=bool(chosen) and _answers_a_question(scored, best),
        unknown=1.0 - _share_in(matcher, shared, everything) if shared else 0.0,
        entry_similarity=float(entries.similarity[page]),
        entry_lead=float(
            entries.similarity[page]
            - max((v for i, v in enumerate(entries.similarity) if i != page), default=0.0)
        ),
    )
    log.debug(
        "extractive.scored sentences=%d best=%.3f chosen=%d",
        len(sentences),
        evidence.score,
        len(chosen),
    )
    if not chosen:
        return ExtractiveAnswer(deferral(language, contact_route), (), False, evidence)
    opening = None
    if question.yes_no:
        missing = _missing(question, matcher, everything)
        if missing is None:
            opening = _yes_no(question, picked, matcher)
        elif members := _best_list(scored, page, min_similarity / 2):
            # "Can I pay with Bitcoin?" and a list of the ways to pay without it: no
            if _contains_words(said if said is not None else question.text, missing):
                opening = phrase("not_listed", language, thing=missing)
            picked = [sentences[i] for i in members]
            # the answer names what is missing: that word is accounted for
            rest = [t for t in shared if t not in {fold(w) for w in words(missing)}]
            evidence = replace(
                evidence,
                quote_coverage=_share(matcher, rest, picked) if rest else 1.0,
                unknown=1.0 - _share_in(matcher, rest, everything) if rest else 0.0,
            )
    subject = subject_of(passages[page].title)
    parts = _compose(picked, subject)
    if listed and subject and fold(subject) not in fold(parts[0]):
        parts[0] = f"{subject}: {parts[0]}"
    if opening is not None and not _VERDICT.match(picked[0].text if picked else ""):
        parts.insert(0, opening)  # (unless the quote opens with its own "No.")
    content_language = passages[page].language
    if evidence.other_language and content_language:
        other = language_name(content_language, language)
        parts.insert(0, phrase("only_in", language, other=other))
    citations = tuple(dict.fromkeys(s.source + 1 for s in picked))
    return ExtractiveAnswer(" ".join(parts), citations, True, evidence)


def _share(matcher: _Matcher, terms: Sequence[str], picked: Sequence[Sentence]) -> float:
    return _share_in(matcher, terms, [" ".join(f"{s.heading} {s.text}" for s in picked)])


def _share_in(matcher: _Matcher, terms: Sequence[str], parts: Sequence[str]) -> float:
    """The share of ``terms`` in the text ``parts`` make joined by spaces."""
    if not terms:
        return 1.0
    found = matcher.found(*parts)
    for term in terms:
        if term not in found and (code := country(term)) and region_holds(code, " ".join(parts)):
            found[term] = REGION_MATCH  # "Austria" in the row of the other EU countries
    return sum(found.get(t, 0.0) for t in terms) / len(terms)


def _margin(page_scores: NDArray[np.float32]) -> float:
    ranked = sorted((float(v) for v in page_scores if v >= 0), reverse=True)
    return ranked[0] - ranked[1] if len(ranked) > 1 else (ranked[0] if ranked else 0.0)


def _other_language(passage: Passage, language: str) -> bool:
    if not passage.language:
        return False
    return passage.language.split("-")[0] != language.split("-")[0]
