"""How long one turn can take at most, from the timeouts that bound its parts.

A process told to stop gives the turns it has begun this long to finish: `parley serve` the
widget's streams and the API's turns (`gateway.commands.serve.shutdown_grace`), the workers
the WhatsApp and Telegram turns they hold. A turn's parts, each bounded on its own:

- a voice note: its download (``media_timeout_seconds``) and transcription
  (`core.transcribe.DEFAULT_TIMEOUT`), when a transcription model is configured;
- the short reply that rewrites a follow-up and translates the question
  (``rewrite_timeout_ms``);
- up to `core.answer.gates.MAX_DRAFTS` drafts of the answer, each the model's whole reply
  (`core.llm.openai_chat.DEFAULT_TOTAL_TIMEOUT`; an exploration stops sooner,
  `core.answer.explore.session.MAX_SECONDS`) and the critic's verdict on it
  (``critic_timeout_ms``, with a critic model);
- the turn's own work: embedding, searching, quoting, saving (`OWN_WORK`).

Not bounded: a wait for the agent's model limits (``llm_concurrency``,
``llm_requests_per_minute``) before a model call, and a burst of several voice notes
answered as one turn. A worker whose turn is still running when the time is up puts its
messages back at once, for another worker: they are answered later, never lost.
"""

from __future__ import annotations

from core.answer.explore.session import MAX_SECONDS as EXPLORATION_SECONDS
from core.answer.gates import MAX_DRAFTS
from core.llm.openai_chat import DEFAULT_TOTAL_TIMEOUT
from core.settings import Settings
from core.transcribe import DEFAULT_TIMEOUT as TRANSCRIPTION_SECONDS

# Embedding the question, searching, quoting the sources and saving, on a busy machine.
OWN_WORK = 10.0


def longest_turn(settings: Settings, *, voice: bool = True) -> float:
    """Seconds the slowest turn these settings allow takes (``voice``: one that starts from a
    voice note, as WhatsApp and Telegram turns may)."""
    seconds = OWN_WORK
    if not settings.llm_configured:
        return seconds  # extractive answers: no model to wait for
    if voice and settings.transcribe_model:
        seconds += settings.media_timeout_seconds + TRANSCRIPTION_SECONDS
    seconds += settings.rewrite_timeout_ms / 1000
    draft = max(DEFAULT_TOTAL_TIMEOUT, EXPLORATION_SECONDS)
    if settings.critic_model:
        draft += settings.critic_timeout_ms / 1000
    return seconds + MAX_DRAFTS * draft
