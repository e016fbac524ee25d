"""Exploration mode: the model answers by browsing the agent's pages as a read-only file tree."""

from core.answer.explore.session import Explored, Explorer, check_settings, explores
from core.answer.explore.tree import PageTree

__all__ = ["Explored", "Explorer", "PageTree", "check_settings", "explores"]
