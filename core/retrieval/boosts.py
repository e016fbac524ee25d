"""Boosts applied after fusion (never to the recorded match score), and the thresholds."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from core.knowledge.classify import policy_topic

CURRENT_PAGE_BOOST = 0.15
CURRENT_PAGE_MARGIN = 0.15  # the current page counts when its match is this close to the bar
POLICY_BOOST = 0.10
POLICY_THRESHOLD_DROP = 0.10
PRODUCT_CODE_BOOST = 1.0

# Words by which a visitor points at the page they are on.
_DEICTIC = re.compile(
    r"\b(this|here|these|deze|dit|hier|dieser|diese|dieses|hier|ici|ce|cette|ceci)\b",
    re.IGNORECASE,
)
# Product codes: letters and digits together, like NK-2041, SKU12345, RAL7016.
_CODE = re.compile(
    r"\b(?=[A-Za-z0-9-]*\d)(?=[A-Za-z0-9-]*[A-Za-z])[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*\b"
)


@dataclass(frozen=True, slots=True)
class QuerySignals:
    """What the question itself tells us, worked out once per query."""

    points_at_page: bool
    policy_topic: str | None
    product_codes: tuple[str, ...]

    @classmethod
    def of(cls, question: str) -> QuerySignals:
        codes = tuple(
            sorted({m.group(0).upper() for m in _CODE.finditer(question) if len(m.group(0)) >= 4})
        )
        return cls(bool(_DEICTIC.search(question)), policy_topic(question), codes)


def same_page(url: str, page_url: str | None) -> bool:
    if not page_url:
        return False
    a, b = urlsplit(url), urlsplit(page_url)
    path_a, path_b = a.path.rstrip("/") or "/", b.path.rstrip("/") or "/"
    hosts_match = not a.netloc or not b.netloc or a.netloc.lower() == b.netloc.lower()
    return hosts_match and path_a == path_b


def _contains_code(text: str, code: str) -> bool:
    """The code as a whole token: NK-204 does not match NK-2041."""
    return re.search(rf"(?<![A-Z0-9-]){re.escape(code)}(?![A-Z0-9]|-[A-Z0-9])", text) is not None


@dataclass(frozen=True, slots=True)
class Boost:
    amount: float
    threshold: float
    reasons: tuple[str, ...]


def boost_for(
    *,
    signals: QuerySignals,
    url: str,
    page_type: str,
    text: str,
    match: float,
    threshold: float,
    page_url: str | None,
) -> Boost:
    amount = 0.0
    reasons: list[str] = []
    if same_page(url, page_url) and (
        signals.points_at_page or match >= threshold - CURRENT_PAGE_MARGIN
    ):
        amount += CURRENT_PAGE_BOOST
        reasons.append("current_page")
    if signals.policy_topic and page_type == "policy":
        amount += POLICY_BOOST
        threshold -= POLICY_THRESHOLD_DROP
        reasons.append(f"policy:{signals.policy_topic}")
    if signals.product_codes:
        upper = text.upper()
        if any(_contains_code(upper, code) for code in signals.product_codes):
            amount += PRODUCT_CODE_BOOST
            reasons.append("product_code")
    return Boost(amount, threshold, tuple(reasons))
