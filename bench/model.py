"""The chat model the answer evaluations answer with: the one `PARLEY_LLM_*` configures (any
OpenAI-compatible server: a hosted API, Ollama, llama.cpp's server, vLLM), else none, and the
answers are the extractive answerer's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from core.llm.openai_chat import close_chat_model, open_chat_model
from core.ports import ChatModel
from core.settings import Settings


@asynccontextmanager
async def evaluated_model(settings: Settings) -> AsyncIterator[ChatModel | None]:
    chat = open_chat_model(settings)
    print(f"answers written by {chat.model}" if chat else "answers quoted (no model configured)")
    try:
        yield chat
    finally:
        await close_chat_model(chat)
