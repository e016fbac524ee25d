"""Which embedder a deployment uses: its name and vector size, recorded with each agent's index."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import ConfigError
from core.settings import Settings

USE_MODEL = "universal-sentence-encoder-multilingual-3"
DEFAULT_OPENAI_MODEL = "text-embedding-3-small"

# Sizes of the common OpenAI-compatible models, so start-up needs no network call.
_OPENAI_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}


@dataclass(frozen=True, slots=True)
class EmbedderIdentity:
    """What an index was built with; vectors of two identities never mix in one index."""

    name: str  # "provider:model"
    dimension: int


def configured_embedder(settings: Settings) -> EmbedderIdentity:
    """The identity of the embedder the settings select."""
    if settings.embed_provider == "use":
        return EmbedderIdentity(f"use:{USE_MODEL}", 512)
    model = settings.embed_model or DEFAULT_OPENAI_MODEL
    dimension = _OPENAI_DIMENSIONS.get(model)
    if dimension is None:
        raise ConfigError(
            f"PARLEY_EMBED_MODEL: the vector size of {model!r} is not known; "
            f"use one of {', '.join(sorted(_OPENAI_DIMENSIONS))}"
        )
    return EmbedderIdentity(f"openai:{model}", dimension)
