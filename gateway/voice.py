"""Voice notes into questions: downloaded with the channel's credentials, then transcribed.

What the inbox worker calls (`core.jobs.inbox_worker.Transcripts`); without a transcription
model (``PARLEY_TRANSCRIBE_MODEL``) it is not `available` and the customer is asked to type.
Staff listen to a voice note through `VoiceNotes.download` too, so a media URL is fetched
one way only: through the outbound guard of `core.media.media_session`.
"""

from __future__ import annotations

import logging

import aiohttp

from channels.registry import BY_NAME
from core.inbound import MediaItem
from core.media import media_session
from core.ports import Transcriber
from core.settings import Settings
from core.store.agents import Agent, Agents
from core.transcribe import open_transcriber

log = logging.getLogger(__name__)


class VoiceNotes:
    def __init__(
        self,
        settings: Settings,
        http: aiohttp.ClientSession,
        agents: Agents,
        transcriber: Transcriber | None,
    ) -> None:
        self._settings = settings
        self._http = http  # the guarded media session, this object's own
        self._agents = agents
        self._transcriber = transcriber

    @property
    def available(self) -> bool:
        return self._transcriber is not None

    async def download(self, agent: Agent, channel: str, ref: str) -> tuple[bytes, str]:
        """A customer's attachment (`MediaItem.ref`) and its content type, from their channel;
        `core.errors.MediaUnavailable` when it cannot or may not be fetched."""
        return await BY_NAME[channel].fetch_media(self._http, agent, self._settings, ref)

    async def transcript(self, agent_id: int, channel: str, item: MediaItem) -> str:
        if self._transcriber is None:
            return ""
        agent = await self._agents.by_id(agent_id)
        data, content_type = await self.download(agent, channel, item.ref)
        text = await self._transcriber.transcribe(data, content_type=item.mime_type or content_type)
        log.info(
            "voice.transcribed channel=%s bytes=%d words=%d", channel, len(data), len(text.split())
        )
        return text

    async def close(self) -> None:
        try:
            if self._transcriber is not None:
                await self._transcriber.close()
        finally:
            await self._http.close()


def open_voice_notes(settings: Settings, agents: Agents) -> VoiceNotes:
    return VoiceNotes(settings, media_session(settings), agents, open_transcriber(settings))
