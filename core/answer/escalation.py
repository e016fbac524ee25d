"""A visitor asking for a person: recognising it, business hours, and what the agent says back.

Recognition is a small lexicon per language (en, nl, de, fr, es), not a model: a message
counts when it is nothing but a request for a person ("human please", "Mitarbeiter bitte",
"I want a real person"), or when a verb of contact sits next to a word for a person ("can I
talk to someone", "kan ik een medewerker spreken", "parler à un conseiller"). Words for a
person that are part of something else ("user agent", "human resources") and negated requests
("I don't want to talk to a human") do not count.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.errors import InvalidInput

# -- recognising a request for a person ------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Words that can only mean a person as opposed to the bot.
_PERSON = _words(
    "human humans agent representative operator manager supervisor "  # en
    "mens medewerker medewerkster "  # nl
    "mensch menschen mitarbeiter mitarbeiterin mitarbeitern berater beraterin kundenberater "
    "sachbearbeiter ansprechpartner "  # de
    "humain humaine conseiller conseillere operateur operatrice "  # fr
    "humano humana agente asesor asesora operador operadora"  # es
)
# Words for somebody in general: they count only right next to a verb of contact.
_SOMEBODY = _words(
    "person someone somebody anyone anybody staff employee colleague "
    "iemand persoon collega "
    "jemand jemandem jemanden person kollege kollegin "
    "personne quelquun collegue "
    "persona alguien companero"
)
# "a real person": makes a word for somebody as clear as a word for a person.
_REAL = _words("real actual live echte echt echten echter echtes vraie vrai reel reelle")
# Verbs of contact that look for the person after them ("talk to a human").
_CONTACT = _words(
    "talk speak contact reach connect transfer escalate forward "
    "spreek praat contacteer "
    "sprich "
    "parler discuter contacter joindre passer passez transferer echanger "
    "hablar contactar comunicar comunicarme pasar pasarme pasame transferir conversar"
)
# Dutch and German infinitives stand at the end: the person comes before them too
# ("kan ik een medewerker spreken", "kann ich mit jemandem sprechen").
_CONTACT_AT_END = _words(
    "spreken praten chatten contacteren doorverbinden doorverbonden verbinden "
    "sprechen reden kontaktieren weiterleiten verbunden"
)
# "chat" is a noun as often as a verb: only "chat with/to" counts.
_CHAT = frozenset({"chat"})
_CHAT_WITH = frozenset({"with", "to", "met", "mit", "avec", "con"})
# A visitor writing in the first person between somebody and the verb still asks for them:
# "is there someone I can talk to".
_FIRST_PERSON = frozenset({"i", "we", "ik", "wij", "ich", "wir", "je", "nous", "yo"})
_NEGATIONS = _words("not dont never niet geen nicht kein keine keinen pas jamais nunca tampoco")
# Where a word for a person is part of something else.
_NOT_AFTER = _words(
    "user travel estate shipping customs secret free insurance booking cleaning double "
    "chemical forwarding ai software browser"
)
_NOT_BEFORE = _words("resources resource rights hair body error nature trafficking based string")
# What a message may hold besides the words for a person and still be only a request for one.
_REQUEST_ONLY = _words(
    # en
    "i id me my we a an the to with please pls plz now want wanna need would like can could "
    "may get give let help from by speak talk chat hi hello hey just one yes ok no real "
    "actual live is there any available "
    # nl
    "ik wil graag een de het met mij mag kan kun kunt je alsjeblieft alstublieft aub nu "
    "hallo hoi even echte echt spreken praten hulp helpen van nodig heb ja nee er beschikbaar "
    # de
    "ich will mochte mochten bitte einen ein eine einem mit mir mich kann konnte brauche "
    "hilfe von jetzt hallo echten echter echte sprechen reden sofort ja nein gerne ist da "
    "verfugbar helfen "
    # fr
    "je veux voudrais un une avec moi sil vous plait svp merci besoin ai aide parler puis "
    "peux bonjour vrai vraie maintenant oui non a y il t disponible aider passez "
    # es
    "quiero un una con por favor necesito hablar puedo ayuda de hola real ahora si yo hay "
    "disponible ayudar ayudarme"
)
_WINDOW = 5
_ELISION = re.compile(r"\b(?:l|d|j|qu|m|t|s|n|c)'")
_WORD = re.compile(r"[^\W_]+")


def _tokens(text: str) -> list[str]:
    folded = unicodedata.normalize("NFKD", text.lower())
    folded = "".join(c for c in folded if not unicodedata.combining(c))
    folded = re.sub(r"[’‘`´]", "'", folded)
    folded = _ELISION.sub(" ", folded).replace("'", "")  # l'agent -> agent; don't -> dont
    return _WORD.findall(folded)


@dataclass(frozen=True, slots=True)
class _Who:
    at: int
    clear: bool  # a person for certain, not just "someone"


def _people(tokens: list[str]) -> list[_Who]:
    found = []
    for i, token in enumerate(tokens):
        before = tokens[i - 1] if i else ""
        after = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in _PERSON:
            if before not in _NOT_AFTER and after not in _NOT_BEFORE:
                found.append(_Who(i, True))
        elif token in _SOMEBODY:
            found.append(_Who(i, before in _REAL or after in _REAL))
    return found


def _verbs(tokens: list[str]) -> list[tuple[int, bool]]:
    """Verbs of contact, each with whether a person may come before it."""
    found = []
    for i, token in enumerate(tokens):
        after = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in _CONTACT_AT_END:
            found.append((i, True))
        elif token in _CONTACT or (token in _CHAT and after in _CHAT_WITH):
            found.append((i, False))
    return found


def _negated(tokens: list[str], start: int) -> bool:
    return any(t in _NEGATIONS for t in tokens[max(0, start - 4) : start])


def _pairs(tokens: list[str], verb: int, at_end: bool, who: _Who) -> bool:
    distance = who.at - verb
    if distance > 0:
        return distance <= (_WINDOW if who.clear else 4)
    if distance < -4:
        return False
    # Before an English-style verb, a person is usually the subject ("the agent said I can
    # contact you"), unless the visitor is ("is there someone I can talk to").
    return at_end or any(t in _FIRST_PERSON for t in tokens[who.at + 1 : verb])


def asks_for_person(text: str) -> bool:
    """Whether the visitor asks to be helped by a person instead of the bot."""
    tokens = _tokens(text)
    people = _people(tokens)
    if not people:
        return False
    if any(w.clear for w in people) and all(
        t in _REQUEST_ONLY or t in _PERSON or t in _SOMEBODY for t in tokens
    ):
        return not any(t in _NEGATIONS for t in tokens)
    for verb, at_end in _verbs(tokens):
        for who in people:
            if _pairs(tokens, verb, at_end, who) and not _negated(tokens, min(verb, who.at)):
                return True
    return False


# -- business hours -------------------------------------------------------------------------

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_RANGE = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


@dataclass(frozen=True, slots=True)
class BusinessHours:
    """Opening times per weekday (0 = Monday), as (start, end) minutes after midnight.

    A range whose end is not after its start runs past midnight ("22:00-02:00").
    """

    ranges: Mapping[int, tuple[tuple[int, int], ...]]

    def open_at(self, local: datetime) -> bool:
        minute = local.hour * 60 + local.minute
        for start, end in self.ranges.get(local.weekday(), ()):
            if (start < end and start <= minute < end) or (end <= start <= minute):
                return True
        yesterday = (local - timedelta(days=1)).weekday()
        return any(end <= start and minute < end for start, end in self.ranges.get(yesterday, ()))


def _minutes(hours: str, minutes: str, *, end: bool) -> int:
    value = int(hours) * 60 + int(minutes)
    if int(minutes) > 59 or value > 24 * 60 or (value == 24 * 60 and not end):
        raise ValueError
    return value


def parse_business_hours(value: Any) -> BusinessHours | None:
    """``{"mon": ["09:00-17:30"], "sat": "10:00-16:00", "sun": "closed"}`` -> hours.

    None or ``{}`` means no hours are set: staff are taken to be there at any time. Once
    hours are set, a weekday left out is closed. Raises `InvalidInput` on anything else.
    """
    if value is None or value == {}:
        return None
    if not isinstance(value, Mapping):
        raise InvalidInput("business_hours must map weekdays (mon..sun) to 'HH:MM-HH:MM' ranges")
    ranges: dict[int, tuple[tuple[int, int], ...]] = {}
    for day, spans in value.items():
        if day not in WEEKDAYS:
            raise InvalidInput(f"business_hours: {day!r} is not a weekday (mon, tue, ... sun)")
        if spans is None or spans == "closed":
            spans = []
        if isinstance(spans, str):
            spans = [spans]
        if not isinstance(spans, list):
            raise InvalidInput(f"business_hours.{day}: give a list of 'HH:MM-HH:MM' ranges")
        parsed = []
        for span in spans:
            match = _RANGE.match(span) if isinstance(span, str) else None
            try:
                if match is None:
                    raise ValueError
                start = _minutes(match[1], match[2], end=False)
                end = _minutes(match[3], match[4], end=True)
            except ValueError:
                raise InvalidInput(
                    f"business_hours.{day}: {span!r} is not a range such as '09:00-17:30'"
                ) from None
            if start == end:
                raise InvalidInput(f"business_hours.{day}: {span!r} is an empty range")
            parsed.append((start, end))
        ranges[WEEKDAYS.index(day)] = tuple(parsed)
    return BusinessHours(ranges)


# -- what the agent says ----------------------------------------------------------------------

DEFAULT_HANDOFF_TEXTS: Mapping[str, str] = {
    "en": "I've asked a colleague to join. A person will reply here as soon as possible.",
    "nl": "Ik heb een collega gevraagd om mee te kijken. Een medewerker reageert hier zo snel "
    "mogelijk.",
    "de": "Ich habe eine Kollegin oder einen Kollegen dazugeholt. Ein Mensch antwortet Ihnen "
    "hier so bald wie möglich.",
    "fr": "J'ai demandé à un collègue de prendre le relais. Une personne vous répondra ici dès "
    "que possible.",
    "es": "He pedido a un compañero que se una. Una persona te responderá aquí lo antes posible.",
    "it": "Ho chiesto a un collega di unirsi. Una persona ti risponderà qui il prima possibile.",
}
DEFAULT_OUT_OF_HOURS_TEXTS: Mapping[str, str] = {
    "en": "Our team isn't available right now. Leave your message here and a person will reply "
    "as soon as we're back.",
    "nl": "Ons team is op dit moment niet bereikbaar. Laat je bericht hier achter, dan reageert "
    "een medewerker zodra we er weer zijn.",
    "de": "Unser Team ist gerade nicht erreichbar. Hinterlassen Sie hier Ihre Nachricht, dann "
    "antwortet Ihnen ein Mensch, sobald wir wieder da sind.",
    "fr": "Notre équipe n'est pas disponible pour le moment. Laissez votre message ici : une "
    "personne vous répondra dès notre retour.",
    "es": "Nuestro equipo no está disponible en este momento. Deja tu mensaje aquí y una persona "
    "te responderá en cuanto volvamos.",
    "it": "Il nostro team non è disponibile in questo momento. Lascia qui il tuo messaggio e una "
    "persona ti risponderà non appena saremo di nuovo disponibili.",
}


def _text_setting(name: str, value: Any) -> None:
    if value is None or isinstance(value, str):
        return
    if isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return
    raise InvalidInput(f"{name} must be a text, or texts by language ({{'en': ..., 'nl': ...}})")


def validate_handoff_settings(settings: Mapping[str, Any]) -> None:
    """Check an agent's handoff settings before they are saved; raises `InvalidInput`."""
    parse_business_hours(settings.get("business_hours"))
    _text_setting("handoff_text", settings.get("handoff_text"))
    _text_setting("out_of_hours_text", settings.get("out_of_hours_text"))
    enabled = settings.get("handoff_enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidInput("handoff_enabled must be true or false")


@dataclass(frozen=True, slots=True)
class HandoffPolicy:
    """An agent's handoff settings (in ``agents.settings``), read once per turn.

    ``handoff_enabled`` (default true): false for an agent without staff to reply, so no
    visitor is promised a person. ``handoff_text`` / ``out_of_hours_text``: one text, or
    texts by language; the built-in ones cover en, nl, de, fr and es.
    ``business_hours``: see `parse_business_hours`, in the agent's timezone.
    """

    enabled: bool
    hours: BusinessHours | None
    timezone: str
    default_language: str
    handoff_text: str | Mapping[str, str] | None
    out_of_hours_text: str | Mapping[str, str] | None

    @classmethod
    def of(cls, settings: Mapping[str, Any], timezone: str, default_language: str) -> HandoffPolicy:
        try:
            hours = parse_business_hours(settings.get("business_hours"))
        except InvalidInput:
            hours = None  # saved before validation existed: better a person than no reply
        return cls(
            enabled=settings.get("handoff_enabled", True) is not False,
            hours=hours,
            timezone=timezone,
            default_language=default_language,
            handoff_text=settings.get("handoff_text") or None,
            out_of_hours_text=settings.get("out_of_hours_text") or None,
        )

    def staffed(self, now: datetime) -> bool:
        if self.hours is None:
            return True
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            zone = ZoneInfo("UTC")
        return self.hours.open_at(now.astimezone(zone))

    def reply(self, language: str, now: datetime) -> tuple[str, bool]:
        """The text for a visitor who asked for a person, and whether staff are in now."""
        if self.staffed(now):
            return self._pick(self.handoff_text, DEFAULT_HANDOFF_TEXTS, language), True
        return self._pick(self.out_of_hours_text, DEFAULT_OUT_OF_HOURS_TEXTS, language), False

    def _pick(
        self, configured: str | Mapping[str, str] | None, defaults: Mapping[str, str], lang: str
    ) -> str:
        if isinstance(configured, str):
            return configured
        for choices in (configured or {}, defaults):
            for candidate in (lang, self.default_language, "en"):
                text = choices.get(candidate)
                if text:
                    return text
        return defaults["en"]
