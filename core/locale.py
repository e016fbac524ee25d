"""Which language a page or a question is in: URL language folders, declared tags, detection."""

from __future__ import annotations

import logging
import re
import threading
from typing import Any
from urllib.parse import unquote, urlsplit

from py3langid.langid import MODEL_FILE, LanguageIdentifier

log = logging.getLogger(__name__)

# ISO 639-1, without the withdrawn codes (in, iw, ji, jw, mo, sh).
ISO_639_1 = frozenset(
    {
        "aa", "ab", "ae", "af", "ak", "am", "an", "ar", "as", "av", "ay", "az", "ba", "be",
        "bg", "bi", "bm", "bn", "bo", "br", "bs", "ca", "ce", "ch", "co", "cr", "cs", "cu",
        "cv", "cy", "da", "de", "dv", "dz", "ee", "el", "en", "eo", "es", "et", "eu", "fa",
        "ff", "fi", "fj", "fo", "fr", "fy", "ga", "gd", "gl", "gn", "gu", "gv", "ha", "he",
        "hi", "ho", "hr", "ht", "hu", "hy", "hz", "ia", "id", "ie", "ig", "ii", "ik", "io",
        "is", "it", "iu", "ja", "jv", "ka", "kg", "ki", "kj", "kk", "kl", "km", "kn", "ko",
        "kr", "ks", "ku", "kv", "kw", "ky", "la", "lb", "lg", "li", "ln", "lo", "lt", "lu",
        "lv", "mg", "mh", "mi", "mk", "ml", "mn", "mr", "ms", "mt", "my", "na", "nb", "nd",
        "ne", "ng", "nl", "nn", "no", "nr", "nv", "ny", "oc", "oj", "om", "or", "os", "pa",
        "pi", "pl", "ps", "pt", "qu", "rm", "rn", "ro", "ru", "rw", "sa", "sc", "sd", "se",
        "sg", "si", "sk", "sl", "sm", "sn", "so", "sq", "sr", "ss", "st", "su", "sv", "sw",
        "ta", "te", "tg", "th", "ti", "tk", "tl", "tn", "to", "tr", "ts", "tt", "tw", "ty",
        "ug", "uk", "ur", "uz", "ve", "vi", "vo", "wa", "wo", "xh", "yi", "yo", "za", "zh",
        "zu",
    }
)  # fmt: skip

# Real codes that, as a first path segment, almost always mean something else
# ("/my/account", "/my/orders" on shops) rather than Burmese.
_NOT_FOLDERS = frozenset({"my"})

# European languages plus a few big others. Leaving out close relatives that rarely occur
# on our sites (Afrikaans, Frisian, Luxembourgish) keeps short Dutch and German text from
# being labelled as one of them.
DETECTABLE_LANGUAGES = (
    "en", "nl", "de", "fr", "es", "it", "pt", "da", "sv", "no", "fi", "is", "pl", "cs", "sk",
    "hu", "ro", "el", "bg", "hr", "sl", "et", "lv", "lt", "ga", "mt", "tr", "ru", "uk", "ar",
    "he", "hi", "ja", "ko", "zh",
)  # fmt: skip

MIN_LETTERS = 10  # below this, n-gram statistics are noise ("Hallo", "ok", a SKU)
MIN_CONFIDENCE = 0.75
_SAMPLE_CHARS = 3000  # the start of a page says as much as all of it, at a fraction of the cost

_LOCALE = re.compile(r"([a-z]{2})(?:[-_]([a-z]{2}))?", re.IGNORECASE)
_TAG_SPLIT = re.compile(r"[-_]")

_identifier: Any = None
_identifier_lock = threading.Lock()


def _folder_locale(segment: str) -> str | None:
    match = _LOCALE.fullmatch(segment)
    if match is None:
        return None
    language = match.group(1).lower()
    if language not in ISO_639_1 or language in _NOT_FOLDERS:
        return None
    region = match.group(2)
    return f"{language}-{region.lower()}" if region else language


def locale_from_url(url: str) -> str | None:
    """The language folder that starts a URL's path: ``/nl_BE/x`` -> ``"nl-be"``, else None."""
    path = unquote(urlsplit(url).path)
    first = path.lstrip("/").split("/", 1)[0]
    return _folder_locale(first) if first else None


def language_of(locale: str) -> str:
    """The language part of a locale: ``"de-de"`` -> ``"de"``, ``"nl_BE"`` -> ``"nl"``."""
    return _TAG_SPLIT.split(locale.strip(), maxsplit=1)[0].lower()


def normalise_locale(tag: str | None) -> str | None:
    """A declared language tag as we store it (``"en_GB"`` -> ``"en-gb"``); None if unusable.

    Script and variant subtags are dropped (``"zh-Hant-TW"`` -> ``"zh-tw"``); tags whose
    language is not ISO 639-1 (``"x-default"``, ``"und"``) are refused.
    """
    if not tag:
        return None
    parts = [p.lower() for p in _TAG_SPLIT.split(tag.strip()) if p]
    if not parts or parts[0] not in ISO_639_1:
        return None
    region = next((p for p in parts[1:] if len(p) == 2 and p.isalpha()), None)
    return f"{parts[0]}-{region}" if region else parts[0]


def _language_identifier() -> Any:
    global _identifier
    if _identifier is None:
        with _identifier_lock:
            if _identifier is None:
                identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
                identifier.set_languages(list(DETECTABLE_LANGUAGES))
                _identifier = identifier
                log.debug("locale.detector.loaded languages=%d", len(DETECTABLE_LANGUAGES))
    return _identifier


def detect_language(text: str) -> str | None:
    """The language of ``text`` ("nl"), or None when it is too short or the guess is weak."""
    sample = text[:_SAMPLE_CHARS]
    if sum(c.isalpha() for c in sample) < MIN_LETTERS:
        return None
    language, confidence = _language_identifier().classify(sample)
    if confidence < MIN_CONFIDENCE:
        return None
    return str(language)


def resolve_locale(url: str, declared: str | None = None, text: str = "") -> str | None:
    """A page's locale: its URL language folder, else its declared language, else detection."""
    return locale_from_url(url) or normalise_locale(declared) or detect_language(text)
