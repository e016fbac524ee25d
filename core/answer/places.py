"""Countries a question names that the content covers only as a region ("Other EU
countries", "Overige EU-landen", "rest of the world").

A shipping or returns table rarely lists every country: "Austria" is answered by the row for
the other EU countries. Country names in the languages the bot speaks come from the CLDR data
that Babel ships; which countries form the EU is the one fact kept here.
"""

from __future__ import annotations

import functools
import re

from babel import Locale

from core.answer.question import fold

LANGUAGES = ("en", "nl", "de", "fr", "es", "it")
EU_MEMBERS = frozenset(
    {"AT", "BE", "BG", "CY", "CZ", "DE", "DK", "EE", "ES", "FI", "FR", "GR", "HR", "HU"}
    | {"IE", "IT", "LT", "LU", "LV", "MT", "NL", "PL", "PT", "RO", "SE", "SI", "SK"}
)
# A row for the EU as a whole, or for every country not listed elsewhere.
_EU = re.compile(
    r"\b(eu|e\.u\.|european union|europese unie|europaische union|union europeenne|"
    r"union europea|unione europea)\b"
)
_ANYWHERE = re.compile(
    r"\b(worldwide|rest of the world|all other countries|wereldwijd|rest van de wereld|"
    r"weltweit|rest der welt|monde entier|reste du monde|todo el mundo|resto del mundo|"
    r"tutto il mondo|resto del mondo)\b"
)


@functools.cache
def _countries() -> dict[str, str]:
    """Folded country name -> ISO 3166 code, in every language the bot speaks."""
    names: dict[str, str] = {}
    for language in LANGUAGES:
        for code, name in Locale(language).territories.items():
            if len(code) == 2 and code.isalpha():
                names.setdefault(fold(name), code)
    return names


def country(word: str) -> str | None:
    """The ISO code of a country named by ``word`` ("oostenrijk" -> "AT"), else None."""
    return _countries().get(fold(word))


def region_holds(code: str, text: str) -> bool:
    """``text`` speaks of a region the country belongs to: the EU, or the whole world."""
    folded = fold(text)
    return bool(_ANYWHERE.search(folded)) or (code in EU_MEMBERS and bool(_EU.search(folded)))
