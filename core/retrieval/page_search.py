"""A search for pages rather than passages: the ranked chunks of one question, one result per
page, each with the passages of it that were found (the knowledge-query contract's search)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.retrieval.retriever import Hit, RetrievalQuery, RetrievalResult, Retriever
from core.store.agents import Agent

# Chunks fetched for every page asked for: a page often answers with two or three passages.
CHUNKS_PER_PAGE = 3
# Between two pages of the examined corpus: a line no page's own text holds.
CORPUS_SEPARATOR = "\n\n" + "=" * 40 + "\n\n"


@dataclass(frozen=True, slots=True)
class PageResult:
    title: str
    url: str
    body: str  # the page's passages that were found, in page order
    score: float  # its best passage's ranking score
    tags: tuple[str, ...]
    passed: bool  # its best passage cleared the agent's confidence threshold


@dataclass(frozen=True, slots=True)
class PageSearch:
    results: tuple[PageResult, ...]
    retrieval: RetrievalResult

    def examined_corpus(self) -> str:
        """Everything the search examined as one text: each page's number, title, address,
        tags and passages, pages separated by a line of ``=``."""
        return CORPUS_SEPARATOR.join(
            "\n".join(
                [
                    f"[{number}] {page.title}",
                    f"URL: {page.url}",
                    *([f"Tags: {', '.join(page.tags)}"] if page.tags else []),
                    "",
                    page.body,
                ]
            )
            for number, page in enumerate(self.results, start=1)
        )


def agent_tags(agent_setting: object, asked: Sequence[str]) -> tuple[str, ...]:
    """A tag filter of the agent's settings (a list) joined with the caller's, lower-case:
    a caller narrows what the agent may answer from, never widens it."""
    own = [str(t) for t in agent_setting] if isinstance(agent_setting, list | tuple) else []
    return tuple(sorted({t.lower() for t in [*own, *asked]}))


async def search_pages(
    retriever: Retriever,
    agent: Agent,
    text: str,
    *,
    limit: int,
    include_tags: Sequence[str] = (),
    exclude_tags: Sequence[str] = (),
) -> PageSearch:
    """The ``limit`` best pages for ``text``, best first, whether or not they clear the
    agent's threshold (``passed`` says; ranking is what a search is judged on)."""
    settings = agent.settings
    query = RetrievalQuery(
        agent=agent,
        text=text,
        k=limit * CHUNKS_PER_PAGE,
        include_tags=agent_tags(settings.get("include_tags"), include_tags),
        exclude_tags=agent_tags(settings.get("exclude_tags"), exclude_tags),
    )
    result = await retriever.retrieve(query)
    passed = set(result.hits)
    by_page: dict[str, list[Hit]] = {}
    for hit in result.ranked:
        by_page.setdefault(hit.url, []).append(hit)
    results = []
    for hits in list(by_page.values())[:limit]:
        best = hits[0]
        body = "\n\n".join(h.text for h in sorted(hits, key=lambda h: h.chunk_id))
        results.append(
            PageResult(best.title, best.url, body, best.score, best.tags, best in passed)
        )
    return PageSearch(tuple(results), result)
