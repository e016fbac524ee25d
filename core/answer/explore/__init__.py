"""Exploration mode: the model answers by browsing the agent's pages as a read-only file tree."""

from core.answer.explore.evidence import EvidencePage
from core.answer.explore.session import Explored, Explorer, check_settings, explores
from core.answer.explore.tree import PageTree

__all__ = ["EvidencePage", "Explored", "Explorer", "PageTree", "check_settings", "explores"]
