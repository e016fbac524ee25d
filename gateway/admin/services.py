"""What the staff console and the admin API work with, built once when the gateway starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from channels.registry import BY_NAME, secret_fields
from core.feedback import FeedbackPrompter
from core.handoff import Handoff
from core.keyring import Keyring
from core.knowledge.ingest import Ingestor
from core.knowledge.library import SourceLibrary
from core.memory import build_memory
from core.ports import Cache, Embedder
from core.privacy import CustomerData
from core.settings import Settings
from core.store.agents import Agents
from core.store.answer_checks import AnswerChecks
from core.store.curated import CuratedAnswers
from core.store.gaps import ContentGaps
from core.store.inbox import Inbox
from core.store.inbox_work import InboxWork
from core.store.knowledge import KnowledgeStore
from core.store.notifications import Notifications
from core.store.privacy import Privacy
from core.store.reports import Reports
from core.store.staff import StaffAccounts, StaffSessions
from core.store.transcripts import Transcripts
from gateway.admin.auth import StaffAuth


@dataclass(frozen=True)
class AdminServices:
    """One instance per gateway (``request.app[ADMIN]``): pages and API handlers share it, so
    each concern (auth, conversations, gaps, sources...) has one way in."""

    auth: StaffAuth
    agents: Agents
    staff: StaffAccounts
    transcripts: Transcripts
    gaps: ContentGaps
    sources: SourceLibrary
    curated: CuratedAnswers
    checks: AnswerChecks
    handoff: Handoff
    embedder: Embedder
    inbox: Inbox
    reports: Reports
    inbox_work: InboxWork  # read marks, status, assignment, labels, notes, saved replies
    # An unanswered messaging customer waiting this long (seconds) is listed as stuck.
    inbox_stuck_after: float
    notifications: Notifications  # who waits for a person, and the webhook's deliveries
    # Privacy requests: erase or export one customer's data (the cached memory with it).
    customers: CustomerData
    # "Did this answer your question?" to a messaging customer once staff resolve.
    feedback_prompts: FeedbackPrompter

    @classmethod
    def build(
        cls,
        settings: Settings,
        pool: asyncpg.Pool,
        cache: Cache,
        embedder: Embedder,
        handoff: Handoff,
        agents: Agents,
        outbox_queued: Callable[[], None] | None = None,
    ) -> AdminServices:
        """``outbox_queued`` is called when a message for a customer was queued (this
        process's outbox sender then sends it at once)."""
        staff = StaffAccounts(pool)
        knowledge = KnowledgeStore(pool)
        # Read fresh: staff see a change the moment they made it. The answering side's memory
        # of agents is shared, so the change applies there at once too. Channel secrets
        # written here are sealed: the registry says which fields are.
        admin_agents = agents.unremembered(Keyring.from_settings(settings), secret_fields())
        return cls(
            auth=StaffAuth(settings, staff, StaffSessions(pool), cache),
            agents=admin_agents,
            staff=staff,
            transcripts=Transcripts(pool),
            gaps=ContentGaps(pool),
            sources=SourceLibrary(
                knowledge,
                Ingestor(knowledge, embedder, allow_networks=settings.crawl_allow_networks),
            ),
            curated=CuratedAnswers(pool),
            checks=AnswerChecks(pool),
            handoff=handoff,
            embedder=embedder,
            inbox=Inbox(pool),
            reports=Reports(pool),
            inbox_work=InboxWork(pool),
            inbox_stuck_after=settings.inbox_stuck_after,
            notifications=Notifications(pool),
            customers=CustomerData(Privacy(pool), build_memory(settings, pool, cache, None)),
            feedback_prompts=FeedbackPrompter(
                pool, admin_agents, channels=BY_NAME, queued=outbox_queued
            ),
        )

    async def close(self) -> None:
        await self.sources.close()
