"""Voice notes into questions: downloaded with the channel's credentials, then transcribed.

What the inbox worker calls (`core.jobs.inbox_worker.Transcripts`); without a transcription
model (``PARLEY_TRANSCRIBE_MODEL``) it is not `available` and the customer is asked to type.
"""

from __future__ import annotations

import logging

import aiohttp

from channels.registry import BY_NAME
from core.inbound import MediaItem
from core.ports import Transcriber
from core.settings import Settings
from core.store.agents import Agents
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
        self._http = http
        self._agents = agents
        self._transcriber = transcriber

    @property
    def available(self) -> bool:
        return self._transcriber is not None

    async def transcript(self, agent_id: int, channel: str, item: MediaItem) -> str:
        if self._transcriber is None:
            return ""
        agent = await self._agents.by_id(agent_id)
        data, content_type = await BY_NAME[channel].fetch_media(
            self._http, agent, self._settings, item.ref
        )
        text = await self._transcriber.transcribe(data, content_type=item.mime_type or content_type)
        log.info(
            "voice.transcribed channel=%s bytes=%d words=%d", channel, len(data), len(text.split())
        )
        return text

    async def close(self) -> None:
        if self._transcriber is not None:
            await self._transcriber.close()


def open_voice_notes(settings: Settings, http: aiohttp.ClientSession, agents: Agents) -> VoiceNotes:
    return VoiceNotes(settings, http, agents, open_transcriber(settings))
