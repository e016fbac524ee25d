"""Small talk: a message that is nothing but a greeting, thanks or a goodbye gets a short reply.

No search and no model: "thanks!" has no answer in the website's content, and a model call
for it costs money and time. Only a whole message made of such words is small talk; "hi,
what does shipping to Belgium cost?" is a question like any other.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from core.answer.phrases import LANGUAGES, base_language, phrase
from core.locale import language_of, locale_from_url
from core.store.agents import Agent
from core.turns import TurnRequest

Kind = Literal["greeting", "thanks", "goodbye"]

# Words everyone writes whatever their language ("hi", "ok thanks"): the reply follows the
# conversation's language, English when nothing else is known.
_ANY = ("en", "nl", "de", "fr", "es", "it")

# Phrases as written after `_normalise` (lower case, no accents, no punctuation), with the
# languages they are written in, the likeliest first.
_PHRASES: dict[Kind, dict[tuple[str, ...], tuple[str, ...]]] = {
    "greeting": {
        ("en",): (
            "hello there", "hi there", "hey there", "hiya", "howdy", "greetings",
            "good morning", "good afternoon", "good evening", "morning",
        ),
        _ANY: ("hi", "hey", "hello", "hai", "yo"),
        ("nl", "de"): ("hallo", "hallo daar"),
        ("nl",): ("hoi", "hee", "goedemorgen", "goedemiddag", "goedenavond", "dag", "goeiedag",
                  "goedendag", "hallo allemaal"),
        ("de",): ("guten morgen", "guten tag", "guten abend", "moin", "moin moin", "servus",
                  "gruss gott", "gruezi", "hallo zusammen"),
        ("fr",): ("bonjour", "bonsoir", "salut", "coucou", "bonjour a vous"),
        ("es",): ("hola", "buenos dias", "buenas tardes", "buenas noches", "buenas",
                  "buen dia"),
        ("it",): ("buongiorno", "buonasera", "salve"),
    },
    "thanks": {
        ("en",): (
            "thank you", "thank u", "thankyou", "ty", "tnx", "thanks a lot",
            "thanks so much", "thank you so much", "thank you very much", "thanks very much",
            "many thanks", "much appreciated", "appreciated", "cheers", "thanks again",
            "thank you again",
        ),
        _ANY: ("thanks", "thx"),
        ("nl",): ("bedankt", "dank je", "dank je wel", "dankjewel", "dankje", "dank u",
                  "dank u wel", "dankuwel", "hartelijk dank", "heel erg bedankt",
                  "super bedankt", "top bedankt", "thanks alvast", "alvast bedankt"),
        ("de",): ("danke", "danke schon", "dankeschon", "danke sehr", "vielen dank",
                  "vielen lieben dank", "danke vielmals", "besten dank", "herzlichen dank"),
        ("fr", "nl", "de"): ("merci",),
        ("fr",): ("merci beaucoup", "merci bien", "mille mercis", "merci encore"),
        ("es",): ("gracias", "muchas gracias", "mil gracias", "muchisimas gracias"),
        ("it",): ("grazie", "grazie mille", "grazie tante", "molte grazie"),
    },
    "goodbye": {
        ("en",): ("goodbye", "good bye", "see you", "see ya",
                  "see you later", "have a nice day", "have a good day", "have a great day",
                  "take care", "good night"),
        _ANY: ("ciao", "bye", "bye bye"),
        ("nl",): ("doei", "doeg", "tot ziens", "tot later", "tot de volgende keer",
                  "fijne dag", "fijne dag nog", "prettige dag", "prettige dag nog",
                  "welterusten", "daag"),
        ("de",): ("tschuss", "tschus", "auf wiedersehen", "bis bald", "bis dann",
                  "bis spater", "schonen tag", "schonen tag noch", "gute nacht"),
        ("fr",): ("au revoir", "a bientot", "bonne journee", "bonne soiree", "a plus"),
        ("es",): ("adios", "hasta luego", "hasta pronto", "chao"),
        ("it",): ("arrivederci", "a presto", "buona giornata", "buona serata"),
    },
}  # fmt: skip

# Words that may go with small talk but are none by themselves ("ok thanks", "thanks for
# your help", "hi bot").
_FILLERS = frozenset(
    {
        "ok", "okay", "oke", "okey", "okidoki", "great", "super", "perfect", "perfekt",
        "parfait", "perfecto", "perfetto", "cool", "nice", "top", "fijn", "prima", "mooi",
        "toll", "genial", "gut", "alright", "again", "so", "very", "much", "a", "lot", "all",
        "everyone", "bot", "team", "guys", "folks", "and", "en", "und", "et", "y", "e", "oh",
        "ah", "hihi", "haha", "lol", "nogmaals", "nochmal", "nochmals", "encore", "wel",
        "echt", "heel", "erg", "nog", "noch", "well", "then", "dan", "dann", "for your help",
        "for the help", "for helping", "for the info", "for the information",
        "for the quick answer", "for the answer", "voor je hulp", "voor de hulp", "voor uw hulp",
        "voor de info", "voor de informatie", "voor het antwoord", "fur die hilfe",
        "fur deine hilfe", "fur ihre hilfe", "fur die info", "fur die antwort",
        "pour votre aide", "pour ton aide", "pour laide", "pour linfo", "pour la reponse",
        "por tu ayuda", "por su ayuda", "por la ayuda", "por la informacion", "per laiuto",
        "per il tuo aiuto", "per linformazione", "per la risposta",
    }
)  # fmt: skip

_TABLE: dict[tuple[str, ...], tuple[Kind | None, tuple[str, ...]]] = {
    tuple(text.split()): (kind, languages)
    for kind, by_languages in _PHRASES.items()
    for languages, texts in by_languages.items()
    for text in texts
}
for _filler in _FILLERS:
    _TABLE.setdefault(tuple(_filler.split()), (None, _ANY))
_LONGEST = max(len(words) for words in _TABLE)

# Longer than this, a message says something besides hello or thanks.
MAX_CHARS = 80
MAX_WORDS = 10
# The reply for a message of several kinds: the visitor is leaving, or thanking.
_PRECEDENCE: tuple[Kind, ...] = ("goodbye", "thanks", "greeting")


def _normalise(text: str) -> list[str]:
    """Lower-case words without accents; apostrophes join ("you're" -> "youre"), every other
    character that is no letter or digit (punctuation, emoji) separates."""
    folded = unicodedata.normalize("NFKD", text.casefold())
    plain = "".join(ch for ch in folded if not unicodedata.combining(ch))
    plain = re.sub(r"['’`´]", "", plain)
    # repeated letters stretch a word ("hiii", "thanksss", "byeee"): one is enough to compare
    plain = re.sub(r"(\w)\1{2,}", r"\1", plain)
    return re.findall(r"[^\W_]+", plain)


@dataclass(frozen=True, slots=True)
class SmallTalk:
    kind: Kind
    languages: tuple[str, ...]  # those the words are written in, the likeliest first

    def language(self, preferred: Iterable[str | None]) -> str:
        """The reply language: the first of ``preferred`` (the conversation's so far, the
        page's, the agent's) the words may be in, else the likeliest language of the words."""
        for choice in preferred:
            if choice and base_language(choice) in self.languages:
                return base_language(choice)
        return self.languages[0]

    def reply(self, language: str) -> str:
        return phrase(f"smalltalk_{self.kind}", language)


def small_talk(text: str) -> SmallTalk | None:
    """What the message is, when it is nothing but greetings, thanks or goodbyes (with a few
    words that go with them); None for anything else, a question above all."""
    if len(text) > MAX_CHARS:
        return None
    words = _normalise(text)
    if not words or len(words) > MAX_WORDS:
        return None
    kinds: list[Kind] = []
    languages: list[tuple[str, ...]] = []
    at = 0
    while at < len(words):
        for size in range(min(_LONGEST, len(words) - at), 0, -1):
            found = _TABLE.get(tuple(words[at : at + size]))
            if found is not None:
                kind, written_in = found
                if kind is not None:
                    kinds.append(kind)
                    languages.append(written_in)
                at += size
                break
        else:
            return None  # a word that is not small talk: a question or a remark to answer
    if not kinds:
        return None
    return SmallTalk(kind=next(k for k in _PRECEDENCE if k in kinds), languages=_common(languages))


def _common(languages: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """The languages all the phrases may be in, in the first phrase's order; when they share
    none ("hallo, merci"), those of any of them."""
    shared = [lang for lang in languages[0] if all(lang in other for other in languages)]
    if shared:
        return tuple(shared)
    union: dict[str, None] = {}
    for written_in in languages:
        union.update(dict.fromkeys(written_in))
    return tuple(union)


def preferred_languages(
    request: TurnRequest, agent: Agent, conversation_language: str | None
) -> list[str | None]:
    """The languages a small-talk reply had better be in, first first: the one staff chose
    in the playground, the conversation's so far, the page's, the agent's own."""
    page = request.page.url if request.page and request.page.url else None
    folder = locale_from_url(page) if page else None
    override = request.overrides.get("language") if request.overrides else None
    return [
        language_of(str(override)) if override else None,
        conversation_language,
        request.language,
        language_of(folder) if folder else None,
        agent.default_language,
    ]


__all__ = ["LANGUAGES", "SmallTalk", "preferred_languages", "small_talk"]
