"""Conversation memory: recent messages word for word, a summary of the rest, and clearing."""

from core.memory.memory import (
    ConversationMemory,
    Recollection,
    build_memory,
    catch_up_summaries,
)
from core.memory.summary import Summarizer, Summary, extractive_summary

__all__ = [
    "ConversationMemory",
    "Recollection",
    "Summarizer",
    "Summary",
    "build_memory",
    "catch_up_summaries",
    "extractive_summary",
]
