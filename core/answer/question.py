"""What a question asks for, read without a model: its key words, the kind of fact it wants,
and whether it is a yes/no or a comparing question. Works in en, nl, de, fr, es and it."""

from __future__ import annotations

import copy
import functools
import logging
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import snowballstemmer  # type: ignore[import-untyped]
from py3langid.langid import MODEL_FILE, LanguageIdentifier
from stop_words import get_stop_words  # type: ignore[import-untyped]

from core.locale import detect_language

log = logging.getLogger(__name__)

_STEMMERS = {
    "en": "english", "nl": "dutch", "de": "german", "fr": "french", "es": "spanish",
    "it": "italian",
}  # fmt: skip
_WORD = re.compile(r"[^\W_]+(?:[-'’][^\W_]+)*", re.UNICODE)

# Words every shop question uses that say nothing about what is asked ("you", "please", "shop").
_CHATTER = frozenset(
    """hi hello hey please thanks thank pls want need know tell like get got can could would
    also still just really maybe much many anything something everything one ones thing things
    hoi hallo graag bedankt dank wil willen weten vertel zeggen even nog eens iets alles ding
    jullie bitte danke möchte möchten wissen sagen noch mal etwas ihr euch bonjour merci
    voudrais savoir dire encore quelque chose hola gracias quiero saber decir algo ciao grazie
    vorrei sapere qualcosa may must mag mogen moet moeten darf dürfen muss müssen peux puis
    peut puedo puede posso può""".split()  # noqa: SIM905
)

# The kind of fact a question wants, recognised by words in any of our languages.
_WANTS: dict[str, re.Pattern[str]] = {
    "price": re.compile(
        r"\b(how much|price|prices|priced|cost|costs|expensive|cheap|pay for|charge|charges|"
        r"fee|fees|surcharge|toeslag|gebühr|gebühren|aufpreis|zuschlag|frais|recargo|"
        r"kost|kosten|kosten|prijs|prijzen|duur|goedkoop|hoeveel kost|"
        r"kostet|preis|preise|teuer|günstig|wie viel kostet|wieviel kostet|"
        r"combien|prix|coûte|coût|cher|cuánto cuesta|cuánto vale|precio|cuesta|caro|"
        r"quanto costa|prezzo|costa|caro|amount|order value|minimum order|bedrag|bestelwaarde|"
        r"betrag|bestellwert|mindestbestellwert|montant|importe|importo)\b"
    ),
    "availability": re.compile(
        r"\b(in stock|stock|available|availability|sold out|back in|"
        r"voorraad|leverbaar|verkrijgbaar|beschikbaar|uitverkocht|"
        r"verfügbar|lieferbar|auf lager|vorrätig|ausverkauft|"
        r"disponible|en stock|épuisé|agotado|disponibile|esaurito)\b"
    ),
    "colour": re.compile(
        r"\b(colou?rs?|kleur|kleuren|farbe|farben|couleurs?|colores|colori|colore|"
        r"red|blue|black|green|grey|gray|white|yellow|orange|brown|navy|"
        r"rood|blauw|zwart|groen|grijs|wit|geel|bruin|rot|blau|schwarz|grün|grau|weiß|gelb|"
        r"rouge|bleu|noir|vert|gris|blanc|jaune|rojo|azul|negro|verde|blanco|amarillo|"
        r"rosso|blu|nero|bianco|giallo)\b"
    ),
    "size": re.compile(
        r"\b(sizes?|sizing|fit|fits|maat|maten|maattabel|past|grö(ß|ss)en?|passt|"
        r"tailles?|pointure|tallas?|taglias?|misura)\b"
    ),
    "code": re.compile(
        r"\b(product code|item code|sku|article number|model number|productcode|artikelnummer|"
        r"artikelnr|produktcode|référence|code produit|código|codice|number|nummer|numéro|"
        r"número|numero)\b"
    ),
    "weight": re.compile(
        r"\b(weigh|weighs|weight|heavy|light|gewicht|weegt|zwaar|licht|wiegt|schwer|leicht|"
        r"poids|pèse|lourd|peso|pesa|pesado|pesante)\b"
    ),
    "duration": re.compile(
        r"\b(how long|how many days|how quickly|how fast|when will|delivery time|"
        r"hoe lang|hoeveel dagen|hoe snel|levertijd|"
        r"wie lange|wie viele tage|wie schnell|lieferzeit|"
        r"combien de temps|combien de jours|délai|cuánto tiempo|cuántos días|"
        r"quanto tempo|quanti giorni|how often|hoe vaak|wie oft|combien de fois|"
        r"con qué frecuencia|ogni quanto|when|wanneer|wann|quand|cuándo|quando)\b"
    ),
    "temperature": re.compile(
        r"\b(temperature|temperatuur|temperatur|température|temperatura|degrees|graden|grad|"
        r"degrés|grados|gradi|how warm|how cold|hoe warm|wie warm)\b"
    ),
    # A moment: a date, a year, a day, a time ("When was the shop founded?").
    "date": re.compile(
        r"\b(when|what year|which year|since when|wanneer|welk jaar|sinds wanneer|wann|"
        r"welchem jahr|seit wann|quand|quelle année|depuis quand|cuándo|qué año|desde cuándo|"
        r"quando|che anno|da quando)\b"
    ),
    # A count or a quantity ("How many people work there?").
    "number": re.compile(
        r"\b(how many|wie viele|wieviele|combien de|cuántos|cuántas|quanti|quante)\b"
    ),
    # A length, a height, a distance ("How long is the Rhine?").
    "measure": re.compile(
        r"\b(how tall|how high|how big|how wide|how deep|how far|"
        r"hoe hoog|hoe groot|hoe breed|hoe diep|hoe ver|wie lang ist|wie hoch|wie groß|wie breit|"
        r"wie tief|wie weit|cuánto mide|qué altura|qué longitud|quelle hauteur|"
        r"quelle longueur|quanto è alto|quanto è lungo|quanto misura)\b"
    ),
    # A place ("Where does the Rhine rise?").
    "place": re.compile(r"\b(where|waar|wo|woher|wohin|où|dónde|adónde|dove)\b"),
    # A person ("Who founded the shop?").
    "person": re.compile(r"\b(who|whom|whose|wer|wem|wen|qui|quién|quiénes|chi)\b"),
    "hours": re.compile(
        r"\b(opening hours|opening times|closing|hours|what time|hoe laat|wie spät|"
        r"um wie viel uhr|à quelle heure|a qué hora|a che ora|"
        r"openingstijden|openingsuren|öffnungszeiten|horaires?|horario|orari|orario)\b"
    ),
    "contact": re.compile(
        r"\b(phone|call|telephone|e-?mail|address|reach you|contact|"
        r"where is|where are|waar is|waar zit|wo ist|wo seid|où est|où se trouve|dónde está|"
        r"dove si trova|dov'è|"
        r"telefoon|telefoonnummer|bellen|adres|bereiken|telefon|telefonnummer|rufnummer|"
        r"anrufen|adresse|erreichen|"
        r"téléphone|joindre|teléfono|dirección|correo|telefono|indirizzo)\b"
    ),
}

_WH = re.compile(
    r"^\s*(what|which|who|whom|whose|where|when|why|how|wat|welke|welk|wie|waar|wanneer|"
    r"waarom|hoe|hoeveel|was|welche|welcher|welches|wer|wo|woher|wohin|wann|warum|wieso|"
    r"wieviel|que|quoi|quel|quelle|quels|quelles|qui|où|quand|pourquoi|comment|combien|qué|"
    r"cuál|cuáles|quién|dónde|cuándo|por qué|cómo|cuánto|cuánta|cuántos|cuántas|che|cosa|"
    r"quale|quali|chi|dove|quando|perché|come|quanto|quanti|quante)\b",
    re.IGNORECASE,
)
# Openings of yes/no questions that need no question mark ("can I pay with PayPal").
_YES_NO_START = re.compile(
    r"^\s*(is|are|am|do|does|did|can|could|will|would|should|shall|may|might|have|has|"
    r"kan|kun|kunt|kunnen|mag|mogen|moet|is|zijn|ben|heb|hebt|hebben|heeft|doen|doet|wordt|"
    r"worden|zit|zitten|gaat|verzenden|versturen|leveren|accepteren|verkopen|bieden|"
    r"rekenen|rekent|berekenen|berekent|vragen|vraagt|berechnet|berechnen|verlangt|verlangen|"
    r"kann|kannst|können|könnt|darf|dürfen|muss|ist|sind|bin|gibt|habt|haben|hat|wird|"
    r"werden|liefert|liefern|versendet|versenden|akzeptiert|akzeptieren|nehmt|nehmen|"
    r"verkauft|verkaufen|bietet|bieten|est-ce|puis-je|peut-on|peux|pouvez|acceptez|"
    r"livrez|vendez|avez|êtes|puedo|pueden|puede|aceptan|hay|tienen|venden|envían|es|"
    r"está|posso|potete|può|accettate|spedite|vendete|avete|è)\b",
    re.IGNORECASE,
)
_COMPARES = re.compile(
    r"\b(compare|comparison|difference|differences|versus|vs|better|or the|"
    r"vergelijk|vergelijken|verschil|beter|of de|vergleich|vergleichen|unterschied|besser|"
    r"oder der|oder die|oder das|comparer|différence|mieux|ou le|ou la|comparar|diferencia|"
    r"mejor|o el|o la|confrontare|differenza|meglio|o il|o la)\b",
    re.IGNORECASE,
)


# A question that asks for the members of a set: a "which" word, then an offer or existence
# ("Which payment methods do you accept?", "Welche Zahlungsarten gibt es?", "Welke maten zijn
# er?", "Quels modes de paiement acceptez-vous ?", "¿Qué tallas hay?"), or kinds and options.
_WHICH = re.compile(
    r"^\s*[¿¡]?\s*(which|what|welke|welk|welche|welcher|welches|wat voor|was für|quels|quelles|"
    r"quel|quelle|qué|cuáles|cuál|quali|quale|che)\b",
    re.IGNORECASE,
)
_SET = re.compile(
    r"\b(are there|is there|do you (have|accept|offer|sell|take|support)|are (available|"
    r"possible|accepted|offered)|can i (use|choose|pay)|kinds?|types?|options|"
    r"zijn er|is er|hebben jullie|accepteren jullie|bieden jullie|verkopen jullie|kan ik "
    r"(kiezen|gebruiken|betalen)|soorten|opties|gibt es|habt ihr|haben sie|bietet ihr|bieten sie|"
    r"akzeptiert ihr|akzeptieren sie|nehmt ihr|verkauft ihr|kann ich (wählen|nutzen|bezahlen)|"
    r"arten|sorten|optionen|existe|y a-t-il|il y a|proposez|acceptez|avez-vous|vendez|"
    r"sortes|types|hay|tienen|aceptan|ofrecen|venden|tipos|opciones|ci sono|accettate|avete|"
    r"offrite|vendete|tipi|opzioni)\b",
    re.IGNORECASE,
)
# Words that point at the thing the visitor is looking at ("Is this waterproof?", "Ist diese
# Jacke wasserdicht?", "Is deze in het zwart?").
_DEICTIC = re.compile(
    r"\b(this|these|deze|dit|diese|dieser|dieses|diesen|cet|cette|ces|celui-ci|celle-ci|"
    r"este|esta|estos|estas|esto|questo|questa|questi|queste)\b"
    # (but not a moment: "this week", "deze week", "diese Woche", "cette semaine")
    r"(?!\s+(week|weekend|morning|afternoon|evening|month|year|time|"
    r"week|weekend|ochtend|middag|avond|maand|jaar|keer|woche|wochenende|morgen|abend|monat|"
    r"jahr|mal|semaine|matin|soir|mois|année|fois|semana|mañana|tarde|noche|mes|año|vez|"
    r"settimana|mattina|sera|mese|anno|volta)\b)",
    re.IGNORECASE,
)


def enumerates(text: str) -> bool:
    """Whether a question asks for the members of a set, which a list answers."""
    return bool(_WHICH.search(text) and _SET.search(text))


def deictic(text: str) -> bool:
    """Whether a question points at the thing on the visitor's screen ("is this ...?")."""
    return bool(_DEICTIC.search(text))


@dataclass(frozen=True, slots=True)
class Question:
    """A question as the answerer reads it.

    ``text`` is self-contained (a follow-up already joined to what it leans on); ``focus`` are
    the key words of the visitor's own last message, which decide between close candidates
    ("and Belgium?" after a question about Germany).
    """

    text: str
    language: str
    terms: tuple[str, ...]  # key words of ``text``, lower case, in order
    focus: tuple[str, ...]  # key words of the visitor's own words
    wants: frozenset[str]
    yes_no: bool
    compares: bool
    names: tuple[str, ...]  # capitalised or coded words: names of products, places, brands
    lists: bool = False  # asks for the members of a set ("Which payment methods are there?")
    points: bool = False  # points at what the visitor is looking at ("Is this waterproof?")

    @classmethod
    def read(cls, text: str, language: str, latest: str | None = None) -> Question:
        own = latest if latest is not None else text
        lowered = text.casefold()
        return cls(
            text=text,
            language=language,
            terms=key_words(text, language),
            focus=key_words(own, language),
            wants=wanted_kinds(own) or wanted_kinds(lowered),
            yes_no=is_yes_no(own),
            compares=bool(_COMPARES.search(own)),
            names=names_in(own, language) or names_in(text, language),
            lists=enumerates(own),
            points=deictic(own),
        )


# "Open" asks for opening hours only of a place or on a day ("is the store open on Sunday?",
# not "may I return socks when the packaging is open?").
_OPEN = re.compile(
    r"\b(open|opens|close|closes|closed|geopend|open|gesloten|sluit|offen|geöffnet|"
    r"geschlossen|schließt|ouvert|ouvre|fermé|ferme|abierto|abre|cerrado|aperto|chiuso)\b"
)
_OPEN_WHEN = re.compile(
    r"\b(store|shop|you|winkel|jullie|laden|geschäft|ihr|magasin|boutique|vous|tienda|"
    r"negozio|service|klantenservice|kundenservice|today|tomorrow|tonight|vandaag|morgen|"
    r"heute|aujourd'hui|demain|hoy|mañana|oggi|domani|weekend|christmas|kerst|weihnachten|"
    r"sunday|monday|tuesday|wednesday|thursday|friday|saturday|zondag|maandag|dinsdag|"
    r"woensdag|donderdag|vrijdag|zaterdag|sonntag|montag|dienstag|mittwoch|donnerstag|"
    r"freitag|samstag|dimanche|lundi|samedi|domingo|lunes|sábado|domenica|lunedì|sabato)\b"
)


def wanted_kinds(text: str) -> frozenset[str]:
    """The kinds of fact a text asks for or names ("how much" -> price, "Gewicht" -> weight)."""
    lowered = text.casefold()
    kinds = {kind for kind, pattern in _WANTS.items() if pattern.search(lowered)}
    if _OPEN.search(lowered) and _OPEN_WHEN.search(lowered):
        kinds.add("hours")
    for word in _WORD.findall(lowered):
        # the last part of a compound names the kind: "Komforttemperatur", "verzendkosten"
        for start in range(3, len(word) - 4):
            tail = word[start:]
            kinds.update(
                kind for kind, pattern in _WANTS.items()
                if (m := pattern.match(tail)) is not None and m.end() == len(tail)
            )  # fmt: skip
    if "contact" in kinds:
        kinds.discard("place")  # "where is your store?" wants the address
        kinds.discard("code")  # a phone number is no product code
    return frozenset(kinds)


# Number words that are nothing else, in the languages the bot speaks ("one", "een", "un"
# are articles too, and so are left out).
_NUMBER_WORDS = {
    "2": "two twee zwei deux dos",
    "3": "three drie drei trois tres tre",
    "4": "four vier quatre cuatro quattro",
    "5": "five vijf funf cinq cinco cinque",
    "6": "six zes sechs seis",
    "7": "seven zeven sieben sept siete sette",
    "8": "eight acht huit ocho otto",
    "9": "nine negen neun neuf nueve nove",
    "10": "ten tien zehn dix diez dieci",
    "12": "twelve twaalf zwolf douze doce dodici",
}
_NUMERALS = {word: digits for digits, names in _NUMBER_WORDS.items() for word in names.split()}


def numeral(word: str) -> str | None:
    """The digits a folded word stands for: "3" and "drie" -> "3"; None for other words."""
    if word.isdigit():
        return word.lstrip("0") or "0"
    return _NUMERALS.get(word)


def fold(word: str) -> str:
    """Lower case without accents: "België" and "belgie" compare equal."""
    decomposed = unicodedata.normalize("NFKD", word.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


@functools.cache
def _stop_words(language: str) -> frozenset[str]:
    words: set[str] = set(_CHATTER)
    for lang in {language, "en"}:
        try:
            words.update(fold(w) for w in get_stop_words(lang))
        except Exception:  # a language without a list: only English words and chatter then
            log.debug("question.stop_words.missing language=%s", lang)
    return frozenset(words)


_GUESSABLE = ("en", "nl", "de", "fr", "es", "it")
SURE_WITHOUT_FUNCTION_WORDS = 0.7
# English function words (the Snowball stemmer project's list).
_ENGLISH = frozenset(
    """i me my myself we our ours ourselves you your yours yourself yourselves he him his
    himself she her hers herself it its itself they them their theirs themselves what which
    who whom this that these those am is are was were be been being have has had having do
    does did doing would should could ought i'm you're he's she's it's we're they're i've
    you've we've they've i'd you'd he'd she'd we'd they'd i'll you'll he'll she'll we'll
    they'll isn't aren't wasn't weren't hasn't haven't hadn't doesn't don't didn't won't
    wouldn't shan't shouldn't can't cannot couldn't mustn't let's that's who's what's here's
    there's when's where's why's how's a an the and but if or because as until while of at by
    for with about against between into through during before after above below to from up
    down in out on off over under again further then once here there when where why how all
    any both each few more most other some such no nor not only own same so than too very
    will can just""".split()  # noqa: SIM905
)


@functools.cache
def _own_stop_words(language: str) -> frozenset[str]:
    if language == "en":
        return _ENGLISH  # the package's English list holds content words ("order", "open")
    try:
        return frozenset(fold(w) for w in get_stop_words(language))
    except Exception:  # a language without a list: English words and chatter only
        return frozenset()


def guess_language(text: str) -> str | None:
    """The language of a message too short for statistics ("wat kost de Stormvang?"), by
    its function words; None when no language stands out."""
    found = [fold(w) for w in words(text)]
    # a word several languages share ("was", "die") counts for each of them in part
    shared = {w: sum(w in _own_stop_words(lang) for lang in _GUESSABLE) for w in found}
    counts = {
        lang: sum(1 / shared[w] for w in found if w in _own_stop_words(lang)) for lang in _GUESSABLE
    }
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    (best, top), (_, second) = ranked[0], ranked[1]
    if top >= 0.99 and top > second + 1e-9:
        return best
    if top == 0:
        # no function words ("Öffnungszeiten Laden?"): the letters decide, when they are
        # clear about it
        language, probability = _identifier(_GUESSABLE).classify(text)
        return str(language) if probability >= SURE_WITHOUT_FUNCTION_WORDS else None
    # function words shared by two languages ("Was kostet die ...?"): the rest of the
    # words decide, among the languages those function words allow
    candidates = [lang for lang, count in ranked if count >= top - 1e-9]
    return _identifier(tuple(sorted(candidates))).classify(text)[0]  # type: ignore[no-any-return]


@functools.cache
def _identifier(languages: tuple[str, ...]) -> Any:
    # The one model read from disk (reading takes a second), restricted to ``languages``: a
    # shallow copy shares its tables and keeps only its own few columns. A deep copy took
    # 50-300 ms of the event loop and 28 MB for each new set of languages a question needed.
    identifier = copy.copy(_model())
    identifier.set_languages(list(languages))
    return identifier


@functools.cache
def _model() -> Any:
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def load_language_models() -> None:
    """Reads the language identifiers' models (a second or two, blocking): a process that
    answers calls it in a thread at start, so that no turn reads them on the event loop."""
    _model()
    detect_language("Where is my order?")


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def key_words(text: str, language: str) -> tuple[str, ...]:
    """The words that carry the question: no stop words, no chatter, each once."""
    stop = _stop_words(language.split("-")[0])
    out: dict[str, None] = {}
    for word in words(text):
        folded = fold(word)
        if folded in stop or (len(folded) < 3 and not any(c.isdigit() for c in folded)):
            continue
        out[folded] = None
    return tuple(out)


@functools.cache
def _stemmer(language: str) -> object:
    return snowballstemmer.stemmer(_STEMMERS.get(language, "english"))


@functools.lru_cache(maxsize=200_000)
def stem(word: str, language: str) -> str:
    return str(_stemmer(language.split("-")[0]).stemWord(fold(word)))  # type: ignore[attr-defined]


def is_yes_no(text: str) -> bool:
    """A question answered by yes or no: no question word first, and a verb first or a
    question mark ("Kan ik met PayPal betalen", "Liefert ihr nach Österreich?")."""
    if _WH.search(text):
        return False
    stripped = text.strip().lstrip("¿¡")
    return bool(_YES_NO_START.search(stripped))


_NAME = re.compile(
    r"(?<![\w-])(?:[A-Z][\w-]*\d[\w-]*|[A-Z]{2,}[\w-]*|"
    r"[A-ZÀ-Þ][a-zß-ÿ]+(?:[A-ZÀ-Þ][a-zß-ÿ]+)*(?:[ -](?:[A-Z][\w+]+|\d[\w+]*))*)(?!\w)"
)


def _is_function_word(word: str) -> bool:
    folded = fold(word)
    return any(folded in _own_stop_words(lang) for lang in _GUESSABLE)


def name_found(name: str, text: str) -> bool:
    """Whether ``text`` names ``name``: most of its words there ("Zelt Waddenhuis 2" in a
    page about the "Waddenhuis 2")."""
    own = {fold(w) for w in words(name)}
    there = {fold(w) for w in words(text)}
    return bool(own) and len(own & there) * 2 >= len(own) + (len(own) == 1)


def names_in(text: str, language: str | None = None) -> tuple[str, ...]:
    """Capitalised words and codes that are not the first word of a sentence: the names a
    question is about ("Fjellsti Mid WP", "NK-2041", "Belgium"). In German, where every noun
    is capitalised, a single word is a name only with a digit in it."""
    found: dict[str, None] = {}
    for match in _NAME.finditer(text):
        start = match.start()
        before = text[:start].rstrip()
        first_of_sentence = not before or before[-1] in ".!?¿¡:"
        name = match.group(0)
        single = " " not in name and not any(c.isdigit() for c in name)
        if single and (first_of_sentence or _is_function_word(name) or language == "de"):
            continue
        found[name] = None
    return tuple(found)
