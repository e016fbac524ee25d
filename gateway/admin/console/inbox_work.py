"""The console's inbox work on a conversation: status, assignment, labels, notes, saved
replies and the typing signal, each through the admin API's own operation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from core.errors import ParleyError
from gateway.admin import inbox_api as ops
from gateway.admin.api import path_id
from gateway.admin.console.render import (
    Route,
    call,
    form,
    page,
    redirect,
    render,
    route,
    run,
    text,
    validated,
)
from gateway.middlewares import status_for

LIST = "/admin/conversations"


async def inbox_work_context(request: web.Request, agent: str) -> dict[str, Any]:
    """What the conversation page shows of the inbox work: notes, teammates, saved replies,
    and the labels to suggest: those on the conversation's agent's (``agent``, a slug)."""
    labels = ops.LabelsQuery(agent=agent)
    return {
        "known_labels": (await run(ops.labels, request, ops.LabelsOut, query=labels)).items,
        "notes": (await run(ops.list_notes, request, ops.NoteList)).items,
        "teammates": (await run(ops.teammates, request, ops.TeammateList)).items,
        "saved_replies": (
            await run(ops.conversation_saved_replies, request, ops.SavedReplyList)
        ).items,
    }


async def _act(
    request: web.Request, action: Callable[[Any], Awaitable[object]], done: str, anchor: str = ""
) -> web.StreamResponse:
    conversation_id = path_id(request)
    try:
        await action(call(request))
    except ParleyError as exc:
        # The conversation page, with what went wrong said at its top.
        from gateway.admin.console.conversations import show_with_error

        return await show_with_error(request, exc.message, status_for(exc))
    raise redirect(f"{LIST}/{conversation_id}", done, anchor)


async def status_action(request: web.Request) -> web.StreamResponse:
    wanted = text(await form(request), "status")
    body: Any = None
    try:
        body = validated(ops.StatusBody, {"status": wanted}, {"status": "Status"})
    except ParleyError as exc:
        from gateway.admin.console.conversations import show_with_error

        return await show_with_error(request, exc.message, status_for(exc))
    return await _act(
        request, lambda _: ops.set_status(call(request, body=body)), f"status-{body.status}"
    )


async def assign_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    # "Assign to me" sends staff_id=me beside the select's choice: it wins.
    given = [v for v in data.getall("staff_id", []) if isinstance(v, str)]
    chosen = "me" if "me" in given else (given[0].strip() if given else "")
    if chosen == "me":
        staff_id = call(request).staff.id
    else:
        staff_id = int(chosen) if chosen.isdigit() and len(chosen) < 19 else None
    body = ops.AssignBody(staff_id=staff_id)
    return await _act(request, lambda _: ops.assign(call(request, body=body)), "assigned")


async def label_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    label = text(data, "label")
    if text(data, "remove") == "1":

        async def remove(_: Any) -> object:
            query = validated(ops.LabelQuery, {"label": label}, {"label": "Label"})
            return await ops.remove_label(call(request, query=query))

        return await _act(request, remove, "labelled", "labels")

    async def add(_: Any) -> object:
        body = validated(ops.LabelBody, {"label": label}, {"label": "Label"})
        return await ops.add_label(call(request, body=body))

    return await _act(request, add, "labelled", "labels")


async def note_action(request: web.Request) -> web.StreamResponse:
    note = text(await form(request), "text")

    async def add(_: Any) -> object:
        body = validated(ops.NoteBody, {"text": note}, {"text": "Note"})
        return await ops.add_note(call(request, body=body))

    return await _act(request, add, "noted", "notes")


async def typing_action(request: web.Request) -> web.StreamResponse:
    """Sent by the reply box's script (with the CSRF header) while staff write."""
    await ops.staff_typing(call(request))
    return web.Response(status=204)


async def _saved_replies_page(
    request: web.Request, *, error: str | None = None, status: int = 200
) -> web.Response:
    replies = await run(ops.list_saved_replies, request, ops.SavedReplyList)
    return await render(
        request,
        "admin/saved_replies.html",
        title="Saved replies",
        agent=await call(request).agent(),
        section="conversations",
        replies=replies.items,
        error=error,
        status=status,
    )


@page
async def saved_replies_page(request: web.Request) -> web.StreamResponse:
    return await _saved_replies_page(request)


async def saved_reply_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    agent = request.match_info["agent"]
    try:
        body = validated(
            ops.SavedReplyBody,
            {"title": text(data, "title"), "text": text(data, "text")},
            {"title": "Title", "text": "Text"},
        )
        await ops.create_saved_reply(call(request, body=body))
    except ParleyError as exc:
        return await _saved_replies_page(request, error=exc.message, status=status_for(exc))
    raise redirect(f"/admin/agents/{agent}/saved-replies", "saved-reply-added")


@page
async def delete_saved_reply_action(request: web.Request) -> web.StreamResponse:
    agent = request.match_info["agent"]
    try:
        await ops.delete_saved_reply(call(request))
    except ParleyError as exc:
        # Deleted already (another tab, a second click): the list as it is now says so.
        return await _saved_replies_page(request, error=exc.message, status=status_for(exc))
    raise redirect(f"/admin/agents/{agent}/saved-replies", "saved-reply-deleted")


def routes() -> list[Route]:
    one = LIST + r"/{id:\d+}"
    return [
        route("POST", one + "/status", status_action, role="agent"),
        route("POST", one + "/assign", assign_action, role="agent"),
        route("POST", one + "/labels", label_action, role="agent"),
        route("POST", one + "/notes", note_action, role="agent"),
        route("POST", one + "/typing", typing_action, role="agent"),
        route("GET", "/admin/agents/{agent}/saved-replies", saved_replies_page, role="agent"),
        route("POST", "/admin/agents/{agent}/saved-replies", saved_reply_action, role="agent"),
        route(
            "POST",
            r"/admin/agents/{agent}/saved-replies/{id:\d+}/delete",
            delete_saved_reply_action,
            role="agent",
        ),
    ]
