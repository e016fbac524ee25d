"""How long one turn can take at most, from the timeouts that bound its parts.

A process told to stop gives the turns it has begun this long to finish: `parley serve` the
widget's streams and the API's turns (`gateway.commands.serve.shutdown_grace`), the workers
the WhatsApp and Telegram turns they hold. A turn's parts, each bounded on its own:

- a voice note: its download (``media_timeout_seconds``) and transcription
  (`core.transcribe.DEFAULT_TIMEOUT`), when a transcription model is configured;
- the short replies that rewrite a follow-up and translate the question
  (``llm_timeouts.rewrite``, and ``llm_timeouts.translate`` with a translation model);
- up to `core.answer.gates.MAX_DRAFTS` drafts of the answer, each the model's whole reply
  (``llm_timeouts.answer``, its queue and first token included; an exploration stops
  sooner, `core.answer.explore.session.MAX_SECONDS`) and the critic's verdict on it
  (``llm_timeouts.critic``, with a critic model);
- the turn's own work: embedding, searching, quoting, saving (`OWN_WORK`).

Not bounded: a wait for the agent's model limits (``llm_concurrency``,
``llm_requests_per_minute``) before a model call, and a burst of several voice notes
answered as one turn. A worker whose turn is still running when the time is up puts its
messages back at once, for another worker: they are answered later, never lost.
"""

from __future__ import annotations

from core.answer.explore.session import MAX_SECONDS as EXPLORATION_SECONDS
from core.answer.gates import MAX_DRAFTS
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
    timeouts = settings.llm_timeouts
    seconds += timeouts.rewrite
    if settings.translate_model:
        seconds += timeouts.translate
    draft = max(timeouts.answer, EXPLORATION_SECONDS)
    if settings.critic_model:
        draft += timeouts.critic
    return seconds + MAX_DRAFTS * draft
