"""Phone numbers, e-mail addresses and web hosts in running text: what a written answer may
name only when its sources, the agent's contact route or the visitor's own question do."""

from __future__ import annotations

import re
from functools import cache

import phonenumbers
import tldextract
from babel.core import Locale, UnknownLocaleError, get_global

# The bundled copy of the Public Suffix List: nothing is fetched, nothing is written.
_DOMAINS = tldextract.TLDExtract(
    suffix_list_urls=(), cache_dir=None, include_psl_private_domains=False
)

EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# A host written without a scheme ("refunds-example.com/help"): lower-case labels, the last a
# public suffix (checked below). A capital letter or a following letter makes it no host
# ("Node.js", "z.B."), and one inside an address or a path is read with that address.
_BARE_HOST = re.compile(
    r"(?<![\w@./:\-])((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63})(?![\w@-])"
    r"(?::\d{1,5})?(?:/[^\s<>\"'`\[\]()]*)?"
)


@cache
def phone_region(timezone: str, language: str) -> str:
    """The region national phone numbers ("020 123 4567") are read in: the agent's
    timezone's country, else the likeliest country of its language, else none ("ZZ":
    only numbers written with their country code are recognised)."""
    territory = get_global("zone_territories").get(timezone)
    if isinstance(territory, str) and territory.isalpha():
        return territory
    try:
        subtags = get_global("likely_subtags").get(language.split("-")[0].lower())
        likely = Locale.parse(subtags) if subtags else None
    except (UnknownLocaleError, ValueError, TypeError):
        likely = None
    return likely.territory if likely is not None and likely.territory else "ZZ"


def phone_numbers(text: str, region: str) -> dict[str, str]:
    """The valid phone numbers in ``text`` as written, each keyed by its E.164 form (one
    number in any spelling: "+31 20 123 4567" and "020-1234567" in the Netherlands). Dates,
    prices and codes are no valid numbers, and are not found."""
    found: dict[str, str] = {}
    for match in phonenumbers.PhoneNumberMatcher(text, region):
        e164 = phonenumbers.format_number(match.number, phonenumbers.PhoneNumberFormat.E164)
        found.setdefault(e164, match.raw_string)
    return found


# A run of digits as a number is written ("020-123 45 67", "(0)20 1234567"), and the dates
# that look like one ("1.12.2026", "2026-12-24"), read first so they are no part of a run.
_DIGIT_RUN = re.compile(r"\+?\(?\d[\d \t\u00a0().\-/]{4,}\d")
_DATE = re.compile(r"(?<![\d.])(?:\d{1,2}[./-]\d{1,2}[./-]\d{2,4}|\d{4}-\d{1,2}-\d{1,2})(?![\d])")
# Digits a run needs to be read as a number in any region (the region's own valid numbers
# are found by `phone_numbers` however short).
RUN_DIGITS = 8
# Digits two spellings of one number share at least (a national number without its 0).
_SAME_DIGITS = 7


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def number_runs(text: str) -> list[str]:
    """Runs of at least `RUN_DIGITS` digits written as numbers are ("0900-1234 567"), in
    any region's form, dates aside: what could be a phone number to a reader although no
    region was known to check it."""
    return [
        run for run in _DIGIT_RUN.findall(_DATE.sub(" ", text)) if len(_digits(run)) >= RUN_DIGITS
    ]


def same_digits(digits: str, texts: list[str]) -> bool:
    """Whether ``texts`` write the number whose digits are ``digits``, in any spelling: one
    ends with the other once leading zeros (a trunk prefix) are set aside ("+31 20 123 4567"
    and "020 123 4567")."""
    wanted = digits.lstrip("0")
    for text in texts:
        for run in _DIGIT_RUN.findall(text):
            known = _digits(run).lstrip("0")
            shorter = min(len(known), len(wanted))
            if shorter >= _SAME_DIGITS and (known.endswith(wanted) or wanted.endswith(known)):
                return True
    return False


def same_number(e164: str, texts: list[str]) -> bool:
    """Whether ``texts`` write the number ``e164`` in a form the region could not read (a
    national number where no region is known)."""
    return same_digits(str(phonenumbers.parse(e164).national_number), texts)


def email_addresses(text: str) -> set[str]:
    """The e-mail addresses in ``text``, case folded."""
    return {address.casefold() for address in EMAIL.findall(text)}


def registered_domain(host: str) -> str:
    """The name its owner registered ("shop.example.co.uk" -> "example.co.uk"); "" when the
    host ends in no public suffix."""
    parts = _DOMAINS(host.strip().strip(".").lower())
    return f"{parts.domain}.{parts.suffix}" if parts.domain and parts.suffix else ""


def bare_hosts(text: str) -> list[str]:
    """The hosts ``text`` names without a scheme ("see refunds-example.com"), as written,
    with any path; only names that end in a public suffix ("manual.pdf" is no host)."""
    return [
        match.group(0).rstrip(".,;:!?")
        for match in _BARE_HOST.finditer(text)
        if registered_domain(match.group(1))
    ]
