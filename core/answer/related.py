"""Related reading: after an answer, up to three pages next to it that it did not show as
sources, for the visitor to read on (the ``related`` event, between ``sources`` and ``done``)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from core.errors import Unavailable
from core.retrieval.boosts import same_page
from core.retrieval.retriever import RetrievalQuery, Retriever
from core.turns import TurnEvent, TurnOutput

log = logging.getLogger(__name__)

MAX_RELATED = 3
# Chunks the related search looks through beyond the answer's own search: a wider net, so
# pages that did not make the answer's sources can be found.
WIDER = 2
# Channels whose visitors see related reading: the widget, the playground (staff try the
# widget's answers there and read them in the trace), and the JSON callers of the
# knowledge-query contract. Messaging channels send one reply and list its sources: the
# search would be work nobody reads.
SHOWN_ON = frozenset({"web", "playground", "api"})


# A site's front page, or a language's ("/", "/nl/", "/de/index.html"): the visitor is on
# the site already, so it is nothing to read on.
_FRONT_PAGE = re.compile(r"/?([a-z]{2}([-_][a-z]{2})?/?)?(index\.html?)?", re.IGNORECASE)


def is_front_page(url: str) -> bool:
    return _FRONT_PAGE.fullmatch(urlsplit(url).path) is not None


async def offer_related(
    retriever: Retriever,
    query: RetrievalQuery | None,
    shown: Sequence[str],
    output: TurnOutput,
    *,
    channel: str,
    deferred: bool,
) -> dict[str, Any]:
    """Find up to `MAX_RELATED` pages for the answer's search ``query`` that are neither among
    the ``shown`` sources (their addresses) nor the page the visitor is on, and send them as
    a ``related`` event (none when nothing is found). No query (a curated answer, a handoff,
    a refusal), a deferral, or a channel that does not show them: nothing is searched.

    Returns what the turn's trace records of it (empty when nothing was searched). A search
    that fails costs the answer nothing: it is logged and left out.
    """
    if query is None or deferred or channel not in SHOWN_ON:
        return {}
    started = time.perf_counter()
    try:
        result = await retriever.retrieve(replace(query, k=query.k * WIDER))
    except Unavailable as exc:
        log.warning("related.failed reason=%s", exc.message)
        return {"related": [], "related_error": exc.code}
    taken = set(shown)
    pages = [
        {"title": hit.title, "url": hit.url}
        for hit in result.pages()
        if hit.url not in taken
        and not same_page(hit.url, query.page_url)
        and not is_front_page(hit.url)
    ][:MAX_RELATED]
    if pages:
        await output.emit(TurnEvent("related", {"related": pages}))
    return {
        "related": [page["url"] for page in pages],
        "related_ms": round((time.perf_counter() - started) * 1000, 2),
    }
