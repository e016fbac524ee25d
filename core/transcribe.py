"""Speech to text for voice notes: the LLM API's `/audio/transcriptions`, with a deadline."""

from __future__ import annotations

import asyncio
import logging
import re

from core.errors import ConfigError, ModelFailed
from core.llm.openai_client import (
    FAILURES,
    configured_endpoint,
    failure_reason,
    is_transient,
    open_client,
)
from core.ports import Transcriber
from core.settings import Settings

__all__ = [
    "DEFAULT_TIMEOUT",
    "OpenAITranscriber",
    "Transcriber",
    "audio_filename",
    "open_transcriber",
]

log = logging.getLogger(__name__)

# Long enough for a few minutes of speech at 16 MB; the caller's retries come on top.
DEFAULT_TIMEOUT = 60.0

# The API tells the format by the file name's extension alone, and knows flac, m4a, mp3,
# mp4, mpeg, mpga, oga, ogg, wav and webm. WhatsApp and Telegram voice notes are Opus in Ogg.
_EXTENSIONS = {
    "application/ogg": "ogg",
    "audio/flac": "flac",
    "audio/m4a": "m4a",
    "audio/mp3": "mp3",
    "audio/mp4": "m4a",
    "audio/mpeg": "mp3",
    "audio/ogg": "ogg",
    "audio/opus": "ogg",
    "audio/wav": "wav",
    "audio/wave": "wav",
    "audio/webm": "webm",
    "audio/x-flac": "flac",
    "audio/x-m4a": "m4a",
    "audio/x-wav": "wav",
    "video/mp4": "mp4",
    "video/webm": "webm",
}


def _mime(content_type: str) -> str:
    """``audio/ogg; codecs=opus`` -> ``audio/ogg``."""
    return content_type.split(";", 1)[0].strip().lower() or "application/octet-stream"


def audio_filename(content_type: str) -> str:
    """A file name whose extension names the format, e.g. ``audio.ogg`` for ``audio/ogg``;
    for a type not listed, its subtype (``audio/amr`` -> ``audio.amr``), which the server
    may know or refuse (OpenAI's answers 400: a permanent failure)."""
    mime = _mime(content_type)
    subtype = re.sub(r"[^a-z0-9]", "", mime.rpartition("/")[2].removeprefix("x-"))
    return f"audio.{_EXTENSIONS.get(mime) or subtype or 'bin'}"


class OpenAITranscriber:
    """Transcribes with one request to an OpenAI-compatible API; every failure is
    `ModelFailed`, whose ``transient`` says whether trying again later may work.

    No retries here: a failed voice note is retried, with back-off, by whoever asked (the
    inbox worker retries the whole turn), rather than uploading the audio again at once.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str,
        base_url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._model = model
        self._timeout = timeout
        self._client = open_client(api_key=api_key, base_url=base_url, timeout=timeout)

    @property
    def model(self) -> str:
        return self._model

    async def transcribe(
        self, audio: bytes, *, content_type: str, filename: str | None = None
    ) -> str:
        mime = _mime(content_type)
        name = filename or audio_filename(mime)
        try:
            async with asyncio.timeout(self._timeout):
                result = await self._client.audio.transcriptions.create(
                    model=self._model, file=(name, audio, mime)
                )
        except FAILURES as exc:
            reason, transient = failure_reason(exc), is_transient(exc)
            log.warning(
                "transcribe.failed model=%s bytes=%d type=%s reason=%s transient=%s",
                self._model,
                len(audio),
                mime,
                reason,
                transient,
            )
            raise ModelFailed(f"transcription failed: {reason}", transient=transient) from exc
        return result.text.strip()

    async def close(self) -> None:
        await self._client.close()


def open_transcriber(settings: Settings) -> Transcriber | None:
    """The configured speech-to-text model at the LLM's API, or None without
    PARLEY_TRANSCRIBE_MODEL (voice notes are then not transcribed)."""
    if not settings.transcribe_model:
        return None
    endpoint = configured_endpoint(settings)
    if endpoint is None:
        raise ConfigError(
            "PARLEY_TRANSCRIBE_MODEL is set but no API is: set PARLEY_LLM_API_KEY "
            "(or OPENAI_API_KEY), or PARLEY_LLM_BASE_URL"
        )
    log.info("transcribe.configured model=%s host=%s", settings.transcribe_model, endpoint.host)
    return OpenAITranscriber(
        settings.transcribe_model, api_key=endpoint.api_key, base_url=endpoint.base_url
    )
