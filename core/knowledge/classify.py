"""What a page or a question is about: policy topics and page types, in four languages."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

# Lowercase word stems (English, Dutch, German, French) matched at the start of a word, so
# "verzend" finds "verzendkosten" and "liefer" finds "Lieferzeit". Dutch and German past
# participles start with "ge", hence the separate "geleverd", "geretourneerd" stems. Stems
# that would drag in everyday words are left out on purpose: "ideal" (the Dutch payment
# method, but "ideal for running"), "fit" ("fitness"), a bare "terug" ("terugbellen"),
# "zahl" ("Zahl", "zahlreich"), "sav" ("savoir"), "mangel" ("Mangel an").
POLICY_TOPICS: Mapping[str, tuple[str, ...]] = {
    "shipping": (
        # en
        "ship", "deliver", "dispatch", "postage", "courier", "parcel", "track", "freight",
        # nl
        "verzend", "verzond", "verstuur", "lever", "geleverd", "bezorg", "pakket", "pakje",
        # de
        "versand", "versend", "verschick", "liefer", "geliefert", "zustell", "paket", "porto",
        "sendungsverfolgung",
        # fr
        "livraison", "livrer", "livré", "expédi", "envoi", "colis", "transporteur",
    ),
    "returns": (
        # en
        "return", "refund", "exchange", "withdraw", "cancel",
        # nl
        "retour", "geretourneerd", "terugstu", "teruggestu", "terugzend", "terugbetal",
        "ruil", "geruild", "herroep", "bedenktijd", "annuleer", "geannuleerd",
        # de
        "rückgabe", "rücksend", "rückerstatt", "zurücksend", "zurückschick", "zurückgeb",
        "umtausch", "erstatt", "widerruf", "storn",
        # fr
        "rembours", "échange", "renvoi", "renvoy", "rétractation", "annuler", "annulation",
    ),
    "payment": (
        # en
        "pay", "invoice", "billing", "credit card", "klarna", "afterpay",
        # nl
        "betal", "betaal", "factuur", "facturen", "gefactureerd", "creditcard", "bancontact",
        "achteraf betal",
        # de
        "zahlung", "bezahl", "gezahlt", "rechnung", "lastschrift", "kreditkarte", "vorkasse",
        "überweis",
        # fr
        "paiement", "facture", "carte bancaire", "virement", "prélèvement",
    ),
    "warranty": (
        # en
        "warrant", "guarantee", "defect", "faulty", "broken", "repair",
        # nl; "garanti" and "reparat" also cover German and French
        "garanti", "reparat", "kapot", "gebrek",
        # de
        "gewährleist", "defekt", "kaputt",
        # fr
        "défectu", "panne",
    ),
    "sizes": (
        # en
        "size", "sizing", "measur",
        # nl
        "maat", "maten", "pasvorm",
        # de
        "größe", "grösse", "groesse", "passform", "konfektionsgr",
        # fr
        "taille", "pointure", "mensuration",
    ),
}  # fmt: skip

# Pages of the same legal kind as the policies; matched at the start of a word.
_LEGAL_STEMS = (
    "privacy", "policy", "policies", "terms", "conditions", "voorwaarden", "disclaimer",
    "legal", "agb", "datenschutz", "nutzungsbedingungen", "cgv", "cgu", "confidentialit",
    "mentions légales", "cookie policy", "cookiebeleid", "cookie richtlinie", "beleid",
    "gdpr", "dsgvo", "impressum",
)  # fmt: skip

# Matched as whole words: "contact" but not "contactlenzen".
_FAQ_WORDS = (
    "faq", "faqs", "frequently asked questions", "veelgestelde vragen",
    "veel gestelde vragen", "häufige fragen", "häufig gestellte fragen",
    "questions fréquentes", "foire aux questions",
)  # fmt: skip

_CONTACT_WORDS = (
    "contact", "contact us", "contacteer", "contactformulier", "contactez", "nous contacter",
    "kontakt", "kontaktformular", "klantenservice", "customer service", "kundenservice",
    "kundendienst", "service client", "get in touch",
)  # fmt: skip

_WORD = re.compile(r"\w+")


def _fold(text: str) -> str:
    """Lowercase without accents, so "Rücksendung", "rucksendung" and "RÜCKSENDUNG" agree."""
    decomposed = unicodedata.normalize("NFKD", text.lower().replace("ß", "ss"))
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def _has_marks(word: str) -> bool:
    return _fold(word) != word


def _stem_matches(stem: str, stem_folded: str, words: list[str], folded: list[str]) -> bool:
    """Whether the (possibly multi-word) stem starts at some word of the text.

    A word typed without accents matches an accented stem ("expedition" -> "expédi"), but a
    word with accents must match them ("große" is "large", "größe" is "size").
    """
    stem_words = stem_folded.split()
    span = len(stem_words)
    raw = stem.split()
    for i in range(len(words) - span + 1):
        window = folded[i : i + span]
        if window[:-1] != stem_words[:-1] or not window[-1].startswith(stem_words[-1]):
            continue
        original = words[i : i + span]
        if all(
            not _has_marks(word) or word.startswith(part)
            for word, part in zip(original, raw, strict=True)
        ):
            return True
    return False


def _compiled(stems: Iterable[str]) -> tuple[tuple[str, str], ...]:
    return tuple((stem, _fold(stem)) for stem in stems)


_TOPIC_STEMS = {topic: _compiled(stems) for topic, stems in POLICY_TOPICS.items()}


def _matches_any(stems: tuple[tuple[str, str], ...], text: str) -> bool:
    words = _WORD.findall(unicodedata.normalize("NFC", text.lower()))
    folded = [_fold(w) for w in words]
    return any(_stem_matches(stem, folded_stem, words, folded) for stem, folded_stem in stems)


def policy_topic(text: str) -> str | None:
    """The first policy topic (shipping, returns, payment, warranty, sizes) ``text`` names."""
    for topic, stems in _TOPIC_STEMS.items():
        if _matches_any(stems, text):
            return topic
    return None


def _phrase_pattern(phrases: Iterable[str], *, whole_words: bool) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(_fold(p)).replace(r"\ ", r"\W+") for p in phrases)
    end = r"(?![^\W_])" if whole_words else ""
    return re.compile(rf"(?<![^\W_])(?:{alternatives}){end}")


_LEGAL = _phrase_pattern(_LEGAL_STEMS, whole_words=False)
_FAQ = _phrase_pattern(_FAQ_WORDS, whole_words=True)
_CONTACT = _phrase_pattern(_CONTACT_WORDS, whole_words=True)


def _url_words(url: str) -> str:
    """The path of a URL as words: "/klantenservice/retour-beleid.html" -> "klantenservice ..."."""
    path = unquote(urlsplit(url).path)
    return " ".join(_WORD.findall(path.replace("_", " ")))


def infer_page_type(url: str, title: str, product: Mapping[str, Any] | None = None) -> str:
    """ "product", "policy", "faq", "contact" or "page", from the URL path, title and data."""
    if product:
        return "product"
    words = f"{_url_words(url)} {title}"
    folded = _fold(words)
    if policy_topic(words) is not None or _LEGAL.search(folded):
        return "policy"
    if _FAQ.search(folded):
        return "faq"
    if _CONTACT.search(folded):
        return "contact"
    return "page"
