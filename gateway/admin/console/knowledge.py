"""The console pages about what an agent knows: content gaps, sources and curated answers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from core.errors import ParleyError
from gateway.admin.api import (
    Call,
    add_source,
    create_curated,
    delete_curated,
    delete_source,
    get_curated,
    get_source,
    list_curated,
    list_gaps,
    list_pages,
    list_sources,
    patch_curated,
    patch_page,
    patch_source,
    reindex_source,
    resolve_gaps,
)
from gateway.admin.console.render import (
    Form,
    Route,
    agent_of,
    agent_page,
    call,
    checked,
    form,
    ids,
    items,
    optional,
    page,
    redirect,
    render,
    route,
    run,
    text,
    validated,
)
from gateway.admin.schemas import (
    CuratedBody,
    CuratedList,
    CuratedOut,
    CuratedPatch,
    GapList,
    PageList,
    PagePatch,
    PageQuery,
    ResolveGapsBody,
    SourceBody,
    SourceList,
    SourceOut,
    SourcePatch,
)
from gateway.middlewares import status_for

AGENT = "/admin/agents/{agent}"


# -- content gaps ---------------------------------------------------------------------------


async def _gaps_page(
    request: web.Request, *, error: str | None = None, status: int = 200
) -> web.Response:
    agent = await agent_of(request)
    groups = await run(list_gaps, request, GapList)
    return await render(
        request,
        "admin/gaps.html",
        title=f"Content gaps · {agent.name}",
        agent=agent,
        section="gaps",
        error=error,
        status=status,
        groups=groups.items,
        timezone=agent.timezone,
    )


@page
async def gaps_page(request: web.Request) -> web.StreamResponse:
    return await _gaps_page(request)


@page
async def resolve_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    try:
        body = validated(ResolveGapsBody, {"gap_ids": ids(text(data, "gap_ids").split(","))})
        await resolve_gaps(call(request, body=body))
    except ParleyError as exc:
        return await _gaps_page(request, error=exc.message, status=status_for(exc))
    raise redirect(agent_page(await agent_of(request), "gaps"), "gaps-resolved")


# -- sources --------------------------------------------------------------------------------


async def _sources_page(
    request: web.Request,
    *,
    error: str | None = None,
    status: int = 200,
    values: Form | None = None,
) -> web.Response:
    agent = await agent_of(request)
    sources = await run(list_sources, request, SourceList)
    return await render(
        request,
        "admin/sources.html",
        title=f"Sources · {agent.name}",
        agent=agent,
        section="sources",
        error=error,
        status=status,
        sources=sources.items,
        indexing=any(s.running or s.status == "indexing" for s in sources.items),
        timezone=agent.timezone,
        values=values or {},
    )


@page
async def sources_page(request: web.Request) -> web.StreamResponse:
    return await _sources_page(request)


@page
async def add_source_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    kind = text(data, "kind")
    values: dict[str, Any] = {"kind": kind, "url": optional(data, "url")}
    if tags := items(data, "tags"):
        values["tags"] = tags
    if kind == "text":
        values.update(title=optional(data, "title"), text=optional(data, "text"))
    try:
        body = validated(SourceBody, values, {"url": "URL", "tags": "Tags"})
        await add_source(call(request, body=body))
    except ParleyError as exc:
        return await _sources_page(request, error=exc.message, status=status_for(exc), values=data)
    raise redirect(agent_page(await agent_of(request), "sources"), "source-added")


async def _source_action(
    request: web.Request, action: Callable[[Call], Awaitable[object]], done: str
) -> web.StreamResponse:
    try:
        await action(call(request))
    except ParleyError as exc:
        return await _sources_page(request, error=exc.message, status=status_for(exc))
    raise redirect(agent_page(await agent_of(request), "sources"), done)


async def _source_page(
    request: web.Request,
    *,
    error: str | None = None,
    status: int = 200,
    values: Form | None = None,
    typed_page: str | None = None,
) -> web.Response:
    """A source with its pages and their tags; after a refused form, what was typed (in the
    row of ``typed_page``, for a page's tags)."""
    agent = await agent_of(request)
    source = await run(get_source, request, SourceOut)
    after = validated(PageQuery, {"after": request.query.get("after", "0")}, {"after": "after"})
    pages = await run(list_pages, request, PageList, query=after)
    return await render(
        request,
        "admin/source.html",
        title=f"Pages and tags · {agent.name}",
        agent=agent,
        section="sources",
        error=error,
        status=status,
        source=source,
        pages=pages,
        after=after.after,
        timezone=agent.timezone,
        values=values or {},
        typed_page=typed_page,
    )


@page
async def source_page(request: web.Request) -> web.StreamResponse:
    return await _source_page(request)


@page
async def source_tags_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    try:
        body = validated(SourcePatch, {"tags": items(data, "source_tags")}, {"tags": "Tags"})
        await patch_source(call(request, body=body))
    except ParleyError as exc:
        return await _source_page(request, error=exc.message, status=status_for(exc), values=data)
    raise redirect(request.path.removesuffix("/tags"), "source-tags-saved")


@page
async def page_tags_action(request: web.Request) -> web.StreamResponse:
    """A page's own tags as typed, or (the reset button) those its source gives it again."""
    data = await form(request)
    tags = None if checked(data, "reset") else items(data, "tags")
    try:
        body = validated(PagePatch, {"own_tags": tags}, {"own_tags": "Tags"})
        await patch_page(call(request, body=body))
    except ParleyError as exc:
        return await _source_page(
            request,
            error=exc.message,
            status=status_for(exc),
            values=data,
            typed_page=request.match_info["page"],
        )
    source = agent_page(await agent_of(request), f"sources/{request.match_info['id']}")
    raise redirect(source, "page-tags-saved", f"page-{request.match_info['page']}")


@page
async def reindex_action(request: web.Request) -> web.StreamResponse:
    return await _source_action(request, reindex_source, "source-reindexing")


@page
async def remove_source_action(request: web.Request) -> web.StreamResponse:
    return await _source_action(request, delete_source, "source-removed")


# -- curated answers ------------------------------------------------------------------------

_CURATED_LABELS = {"answer": "Answer", "pattern": "Pattern", "language": "Language", "": ""}


def _shown(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "keywords": ", ".join(values.get("keywords") or ())}


def _curated_values(data: Form) -> dict[str, Any]:
    return {
        "question": text(data, "question"),
        "keywords": items(data, "keywords"),
        "pattern": optional(data, "pattern"),
        "answer": text(data, "answer"),
        "language": optional(data, "language"),
        "enabled": checked(data, "enabled"),
    }


async def _curated_page(
    request: web.Request,
    *,
    error: str | None = None,
    status: int = 200,
    values: dict[str, Any] | None = None,
) -> web.Response:
    agent = await agent_of(request)
    entries = await run(list_curated, request, CuratedList)
    prefill = {"question": request.query.get("question", ""), "enabled": True}
    return await render(
        request,
        "admin/curated.html",
        title=f"Curated answers · {agent.name}",
        agent=agent,
        section="curated",
        error=error,
        status=status,
        entries=entries.items,
        values=_shown(values or prefill),
    )


@page
async def curated_page(request: web.Request) -> web.StreamResponse:
    return await _curated_page(request)


@page
async def create_curated_action(request: web.Request) -> web.StreamResponse:
    values = _curated_values(await form(request))
    try:
        body = validated(CuratedBody, values, _CURATED_LABELS)
        await create_curated(call(request, body=body))
    except ParleyError as exc:
        return await _curated_page(
            request, error=exc.message, status=status_for(exc), values=values
        )
    raise redirect(agent_page(await agent_of(request), "curated"), "curated-created")


async def _edit_page(
    request: web.Request,
    *,
    error: str | None = None,
    status: int = 200,
    values: dict[str, Any] | None = None,
) -> web.Response:
    agent = await agent_of(request)
    entry = await run(get_curated, request, CuratedOut)
    return await render(
        request,
        "admin/curated_edit.html",
        title=f"Edit curated answer · {agent.name}",
        agent=agent,
        section="curated",
        error=error,
        status=status,
        entry=entry,
        values=_shown(values or entry.model_dump()),
    )


@page
async def edit_curated_page(request: web.Request) -> web.StreamResponse:
    return await _edit_page(request)


@page
async def save_curated_action(request: web.Request) -> web.StreamResponse:
    values = _curated_values(await form(request))
    try:
        body = validated(CuratedPatch, values, _CURATED_LABELS)
        await patch_curated(call(request, body=body))
    except ParleyError as exc:
        return await _edit_page(request, error=exc.message, status=status_for(exc), values=values)
    raise redirect(agent_page(await agent_of(request), "curated"), "curated-saved")


@page
async def delete_curated_action(request: web.Request) -> web.StreamResponse:
    try:
        await delete_curated(call(request))
    except ParleyError as exc:
        return await _curated_page(request, error=exc.message, status=status_for(exc))
    raise redirect(agent_page(await agent_of(request), "curated"), "curated-deleted")


def routes() -> list[Route]:
    source = AGENT + r"/sources/{id:\d+}"
    curated = AGENT + r"/curated/{id:\d+}"
    return [
        route("GET", AGENT + "/gaps", gaps_page, role="agent"),
        route("POST", AGENT + "/gaps/resolve", resolve_action, role="agent"),
        route("GET", AGENT + "/sources", sources_page),
        route("POST", AGENT + "/sources", add_source_action),
        route("GET", source, source_page),
        route("POST", source + "/tags", source_tags_action),
        route("POST", source + r"/pages/{page:\d+}/tags", page_tags_action),
        route("POST", source + "/reindex", reindex_action),
        route("POST", source + "/remove", remove_source_action),
        route("GET", AGENT + "/curated", curated_page, role="agent"),
        route("POST", AGENT + "/curated", create_curated_action, role="agent"),
        route("GET", curated, edit_curated_page, role="agent"),
        route("POST", curated, save_curated_action, role="agent"),
        route("POST", curated + "/delete", delete_curated_action, role="agent"),
    ]
