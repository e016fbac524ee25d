"""The notifier service: staff's webhook hears who waits for a person (`core.jobs.notifier`)."""

from __future__ import annotations

from core.jobs.notifier import Notifier, Webhook
from core.store.notifications import Notifications
from gateway.runtime import Answering


async def run_notifier(answering: Answering) -> None:
    """Writes long waits as events and posts every event to PARLEY_NOTIFY_WEBHOOK (when set),
    until cancelled."""
    runtime = answering.runtime
    settings = runtime.settings
    webhook = None
    if settings.notify_webhook is not None and settings.notify_secret is not None:
        webhook = Webhook(settings.notify_webhook, settings.notify_secret.get_secret_value())
    await Notifier(
        Notifications(runtime.database.pool),
        webhook=webhook,
        waiting_after=settings.notify_waiting_minutes * 60,
        console_url=settings.public_url or "",
    ).run()
