"""The admin API's inbox work: the live list's change feed, read marks, open/pending/resolved,
assignment, labels, internal notes, saved replies and the staff typing signal.

Declared with `gateway.admin.api.operation` like every other route (so they are in the
OpenAPI document); `gateway.admin.api` imports this module at its end to register them.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Literal

from pydantic import Field

from core.errors import Unauthorized
from core.handoff import Follower
from core.store.database import MAX_ID
from core.store.inbox_work import MAX_LABEL, MAX_NOTE, MAX_SAVED_TEXT, fill_placeholders
from core.store.staff import Role
from gateway.admin import schemas as s
from gateway.admin.api import Call, operation
from gateway.admin.guard import while_allowed
from gateway.keys import CONVERSATION_FEED

# A long poll answers within this long even when nothing changed (proxies drop idle requests).
WAIT_SECONDS = 25.0
CHANGES_ROLE: Role = "agent"


class ChangesQuery(s.Query):
    since: str = Field("", max_length=200, description="version of the last answer")
    wait: float = Field(WAIT_SECONDS, ge=0, le=WAIT_SECONDS, description="seconds to wait")


class ChangesOut(s.Out):
    version: str = Field(description="pass back as since; changes with any change in the list")
    changed: bool


class StatusBody(s.Body):
    status: Literal["open", "pending", "resolved"] = Field(
        description="resolved hands the conversation back to the bot and records who resolved "
        "it and when (what the reports count as resolved)"
    )


class AssignBody(s.Body):
    staff_id: int | None = Field(
        None, ge=1, le=MAX_ID, description="a staff account's id; null: unassigned"
    )


class LabelBody(s.Body):
    label: str = Field(min_length=1, max_length=MAX_LABEL)


class LabelQuery(s.Query):
    label: str = Field(min_length=1, max_length=MAX_LABEL)


class LabelsQuery(s.Query):
    agent: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="an agent's slug: only labels on that agent's conversations",
    )


class LabelsOut(s.Out):
    items: list[str]


class NoteBody(s.Body):
    text: str = Field(min_length=1, max_length=MAX_NOTE)


class NoteOut(s.Out):
    id: int
    conversation_id: int
    author: str
    text: str
    created_at: datetime


class NoteList(s.Out):
    items: list[NoteOut]


class SavedReplyBody(s.Body):
    title: str = Field(min_length=1, max_length=100)
    text: str = Field(
        min_length=1,
        max_length=MAX_SAVED_TEXT,
        description="may hold {{customer_name}} and {{agent_name}} (the staff member's name)",
    )


class SavedReplyOut(s.Out):
    id: int
    title: str
    text: str = Field(description="as saved, or filled in for a conversation")


class SavedReplyList(s.Out):
    items: list[SavedReplyOut]


class TeammateOut(s.Out):
    id: int
    name: str


class TeammateList(s.Out):
    items: list[TeammateOut]


async def _row(call: Call, conversation_id: int) -> s.ConversationOut:
    return s.ConversationOut.model_validate(await call.admin.transcripts.row(conversation_id))


@operation(
    "GET",
    "/conversations/changes",
    "Wait (long poll) until anything in the conversation list changes",
    "conversations",
    query=ChangesQuery,
    response=ChangesOut,
    role=CHANGES_ROLE,
)
async def conversation_changes(call: Call) -> ChangesOut:
    """Ends with 401 within seconds of the session ending or the account being disabled."""
    query: ChangesQuery = call.query
    work = call.admin.inbox_work
    loop = asyncio.get_running_loop()
    ends = loop.time() + query.wait

    async def changes(watcher: Follower) -> ChangesOut:
        # Watching first, reading second: a change in between wakes the watcher.
        while True:
            version = await work.watermark()
            if version != query.since:
                return ChangesOut(version=version, changed=bool(query.since))
            left = ends - loop.time()
            if left <= 0 or watcher.closed:
                return ChangesOut(version=version, changed=False)
            # Re-read now and then too: a lost notification only delays.
            await watcher.wait(min(left, 10.0))

    async with call.request.app[CONVERSATION_FEED].watch() as watcher:
        answer = await while_allowed(call.request, CHANGES_ROLE, changes(watcher))
    if answer is None:
        raise Unauthorized("your session has ended; sign in again")
    return answer


@operation(
    "POST",
    r"/conversations/{id:\d+}/read",
    "Mark a conversation read by you (it is unread again when the visitor writes)",
    "conversations",
    status=204,
    role="agent",
)
async def mark_read(call: Call) -> None:
    conversation_id = await call.conversation()
    await call.admin.inbox_work.mark_read(conversation_id, call.staff.label)


@operation(
    "POST",
    r"/conversations/{id:\d+}/status",
    "Set open, pending or resolved; resolving hands the conversation back to the bot (and, "
    "where the agent's feedback_prompt is on, asks a WhatsApp or Telegram customer whether "
    "the bot's last answer helped)",
    "conversations",
    body=StatusBody,
    response=s.ConversationOut,
    role="agent",
)
async def set_status(call: Call) -> s.ConversationOut:
    body: StatusBody = call.body
    conversation_id = await call.conversation()
    if body.status == "resolved":
        await call.admin.handoff.hand_back(conversation_id)
    await call.admin.inbox_work.set_status(conversation_id, body.status, call.staff.label)
    if body.status == "resolved":
        await call.admin.feedback_prompts.after_resolved(conversation_id)
    return await _row(call, conversation_id)


@operation(
    "POST",
    r"/conversations/{id:\d+}/assign",
    "Assign a conversation to a teammate (staff_id null: to nobody)",
    "conversations",
    body=AssignBody,
    response=s.ConversationOut,
    role="agent",
)
async def assign(call: Call) -> s.ConversationOut:
    body: AssignBody = call.body
    conversation_id = await call.conversation()
    await call.admin.inbox_work.assign(conversation_id, body.staff_id)
    return await _row(call, conversation_id)


@operation(
    "GET",
    "/teammates",
    "Staff one may assign to",
    "conversations",
    response=TeammateList,
    role="agent",
)
async def teammates(call: Call) -> TeammateList:
    members = await call.admin.staff.list()
    return TeammateList(
        items=[
            TeammateOut(id=m.id, name=m.display_name or m.email) for m in members if not m.disabled
        ]
    )


@operation(
    "GET",
    "/labels",
    "Labels in use, on all conversations or on one agent's",
    "conversations",
    query=LabelsQuery,
    response=LabelsOut,
    role="agent",
)
async def labels(call: Call) -> LabelsOut:
    query: LabelsQuery = call.query
    agent_id = None if query.agent is None else (await call.admin.agents.get(query.agent)).id
    return LabelsOut(items=await call.admin.inbox_work.labels_in_use(agent_id))


@operation(
    "POST",
    r"/conversations/{id:\d+}/labels",
    "Label a conversation",
    "conversations",
    body=LabelBody,
    response=s.ConversationOut,
    role="agent",
)
async def add_label(call: Call) -> s.ConversationOut:
    body: LabelBody = call.body
    conversation_id = await call.conversation()
    await call.admin.inbox_work.add_label(conversation_id, body.label)
    return await _row(call, conversation_id)


@operation(
    "DELETE",
    r"/conversations/{id:\d+}/labels",
    "Take a label off a conversation",
    "conversations",
    query=LabelQuery,
    response=s.ConversationOut,
    role="agent",
)
async def remove_label(call: Call) -> s.ConversationOut:
    query: LabelQuery = call.query
    conversation_id = await call.conversation()
    await call.admin.inbox_work.remove_label(conversation_id, query.label)
    return await _row(call, conversation_id)


@operation(
    "GET",
    r"/conversations/{id:\d+}/notes",
    "Internal notes (staff only; the customer and the bot never see them)",
    "conversations",
    response=NoteList,
    role="agent",
)
async def list_notes(call: Call) -> NoteList:
    conversation_id = await call.conversation()
    notes = await call.admin.inbox_work.notes(conversation_id)
    return NoteList.model_validate({"items": notes})


@operation(
    "POST",
    r"/conversations/{id:\d+}/notes",
    "Add an internal note (never sent, never read by the bot)",
    "conversations",
    body=NoteBody,
    response=NoteOut,
    status=201,
    role="agent",
)
async def add_note(call: Call) -> NoteOut:
    body: NoteBody = call.body
    conversation_id = await call.conversation()
    note = await call.admin.inbox_work.add_note(conversation_id, body.text, call.staff.label)
    return NoteOut.model_validate(note)


@operation(
    "POST",
    r"/conversations/{id:\d+}/typing",
    "Tell the visitor (widget) that you are writing; send every few seconds while you write",
    "conversations",
    status=204,
    role="agent",
)
async def staff_typing(call: Call) -> None:
    conversation_id = await call.conversation()
    await call.admin.inbox_work.typing(conversation_id, call.staff.name)


@operation(
    "GET",
    r"/conversations/{id:\d+}/saved-replies",
    "The agent's saved replies, filled in for this conversation",
    "conversations",
    response=SavedReplyList,
    role="agent",
)
async def conversation_saved_replies(call: Call) -> SavedReplyList:
    row = await call.admin.transcripts.row(call.id())
    agent = await call.admin.agents.get(row.agent)
    values = {"customer_name": row.customer_name or "", "agent_name": call.staff.name}
    replies = await call.admin.inbox_work.saved_replies(agent.id)
    return SavedReplyList(
        items=[
            SavedReplyOut(id=r.id, title=r.title, text=fill_placeholders(r.text, values))
            for r in replies
        ]
    )


@operation(
    "GET",
    "/agents/{agent}/saved-replies",
    "Saved replies of an agent",
    "conversations",
    response=SavedReplyList,
    role="agent",
)
async def list_saved_replies(call: Call) -> SavedReplyList:
    agent = await call.agent()
    replies = await call.admin.inbox_work.saved_replies(agent.id)
    return SavedReplyList.model_validate({"items": replies})


@operation(
    "POST",
    "/agents/{agent}/saved-replies",
    "Save a reply ({{customer_name}}, {{agent_name}} are filled in when used)",
    "conversations",
    body=SavedReplyBody,
    response=SavedReplyOut,
    status=201,
    role="agent",
)
async def create_saved_reply(call: Call) -> SavedReplyOut:
    body: SavedReplyBody = call.body
    agent = await call.agent()
    reply = await call.admin.inbox_work.add_saved_reply(agent.id, body.title, body.text)
    return SavedReplyOut.model_validate(reply)


@operation(
    "DELETE",
    r"/agents/{agent}/saved-replies/{id:\d+}",
    "Delete a saved reply",
    "conversations",
    status=204,
    role="agent",
)
async def delete_saved_reply(call: Call) -> None:
    agent = await call.agent()
    await call.admin.inbox_work.delete_saved_reply(agent.id, call.id())
