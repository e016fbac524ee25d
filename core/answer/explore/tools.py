"""The read-only tools an exploring model calls: ls, find, cat and grep over the page tree."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.answer.explore.evidence import Evidence
from core.answer.explore.tree import PageFile, PageTree
from core.answer.extractive import subject_of
from core.patterns import cached_pattern
from core.ports import Tool
from core.retrieval.retriever import Retriever
from core.store.page_catalog import PageCatalog

MAX_PAGE_CHARS = 6000  # of a page `cat` shows
MAX_PATTERN_CHARS = 200
GREP_PAGES = 20  # pages the index proposes to grep through
MAX_GREP_LINES = 40
MAX_LINES_PER_PAGE = 5
MAX_LINE_CHARS = 240

TOOLS = (
    Tool(
        "ls",
        "List a folder of the website: its folders (ending in /) and pages (name.md with the "
        "page's title), one a line.",
        {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "a folder, e.g. / or /en"}},
        },
    ),
    Tool(
        "find",
        "Find folders and pages whose name or title contains NAME (ignoring case).",
        {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "part of a name"}},
            "required": ["name"],
        },
    ),
    Tool(
        "grep",
        "Show the lines of the pages (under PATH, else everywhere) that contain PATTERN, "
        "ignoring case: a word, a phrase or a simple regular expression.",
        {
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string", "description": "a folder or a page (optional)"},
            },
            "required": ["pattern"],
        },
    ),
    Tool(
        "cat",
        "Open a page: its number to cite it by, its title and address, then its text.",
        {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "e.g. /en/shipping.md"}},
            "required": ["path"],
        },
    ),
)

# What separates the plain words of a pattern: its regular-expression syntax.
_SYNTAX = re.compile(r"\\.|[\^$.|?*+()\[\]{}]")


@dataclass(frozen=True, slots=True)
class ToolResult:
    text: str
    argument: str  # what it was called on, for the trace
    failed: bool = False


class Toolbox:
    """The tools of one exploration: the tree is all the model can see, and every page it
    reads is kept (a grep and then a cat read it once)."""

    def __init__(
        self,
        tree: PageTree,
        catalog: PageCatalog,
        retriever: Retriever,
        evidence: Evidence,
        *,
        agent_id: int,
        language: str | None,
    ) -> None:
        self._tree = tree
        self._catalog = catalog
        self._retriever = retriever
        self._evidence = evidence
        self._agent_id = agent_id
        self._language = language
        self._texts: dict[int, str] = {}

    def page_title(self, name: str, arguments: str) -> str | None:
        """The title of the page a `cat` call opens, when it opens one."""
        if name != "cat":
            return None
        file = self._tree.file(str(_arguments(arguments).get("path", "")))
        if file is None:
            return None
        # "Shipping and delivery | Noordkaap Outdoor": the site's name says nothing here.
        return subject_of(file.page.title) or file.page.title or file.name

    async def run(self, name: str, arguments: str) -> ToolResult:
        args = _arguments(arguments)
        if name == "ls":
            path = str(args.get("path") or "/")
            return _result(self._tree.ls(path), path)
        if name == "find":
            wanted = str(args.get("name") or "")
            return _result(self._tree.find(wanted), wanted)
        if name == "cat":
            return await self._cat(str(args.get("path") or ""))
        if name == "grep":
            where = args.get("path")
            return await self._grep(str(args.get("pattern") or ""), str(where) if where else None)
        return ToolResult(f"{name}: no such tool (there are ls, find, grep, cat)", "", True)

    async def _cat(self, path: str) -> ToolResult:
        file = self._tree.file(path) if path else None
        if file is None:
            where = "a folder; ls it" if path and self._tree.is_folder(path) else "no such page"
            return ToolResult(f"cat: {path or '(no path)'}: {where}", path, True)
        text = (await self._read([file]))[file.page.id]
        if len(text) > MAX_PAGE_CHARS:
            text = text[:MAX_PAGE_CHARS].rsplit(" ", 1)[0] + " … (the rest of the page is cut)"
        number = self._evidence.open(file.page, text)
        title = file.page.title or file.name
        return ToolResult(f"[{number}] {title}\nURL: {file.page.url}\n\n{text}", file.path)

    async def _grep(self, pattern: str, path: str | None) -> ToolResult:
        argument = f"{pattern} in {path}" if path else pattern
        pattern = pattern.strip()
        if not pattern or len(pattern) > MAX_PATTERN_CHARS:
            return ToolResult(
                f"grep: give a pattern of 1 to {MAX_PATTERN_CHARS} characters", argument, True
            )
        files = self._tree.under(path) if path else self._tree.files
        if files is None:
            return ToolResult(f"grep: {path}: no such file or folder", argument, True)
        # RE2 matches in time linear in the text whatever the pattern; one it cannot compile
        # is taken literally.
        regex = cached_pattern(pattern)
        literals = [pattern] if regex is None else _literals(pattern)
        by_id = {f.page.id: f for f in files}
        candidates = await self._catalog.holding(
            self._agent_id,
            list(by_id),
            words=pattern if regex is None else _SYNTAX.sub(" ", pattern),
            literals=literals,
            language=self._language,
            limit=GREP_PAGES,
        )
        found = [by_id[page_id] for page_id in candidates]
        texts = await self._read(found)
        wanted = pattern.casefold()
        lines: list[str] = []
        for file in found:
            matched = 0
            for number, line in enumerate(texts.get(file.page.id, "").split("\n"), start=1):
                hit = regex.search(line) if regex is not None else wanted in line.casefold()
                if not hit or not line.strip():
                    continue
                lines.append(f"{file.path}:{number}: {_shortened(line.strip())}")
                matched += 1
                if matched == MAX_LINES_PER_PAGE or len(lines) == MAX_GREP_LINES:
                    break
            if len(lines) == MAX_GREP_LINES:
                lines.append("… more lines match; narrow the pattern or give a PATH")
                break
        if not lines:
            return _result(f"grep: no lines contain {pattern!r}", argument)
        return _result("\n".join(lines), argument)

    async def _read(self, files: Sequence[PageFile]) -> dict[int, str]:
        missing = [f.page.id for f in files if f.page.id not in self._texts]
        if missing:
            self._texts.update(await self._retriever.page_texts(self._agent_id, missing))
        return {f.page.id: self._texts.get(f.page.id, "") for f in files}


def _arguments(raw: str) -> dict[str, Any]:
    """The call's arguments; a model may send broken JSON or a bare string."""
    try:
        parsed = json.loads(raw or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _result(text: str, argument: str) -> ToolResult:
    failed = re.match(r"^(?:ls|find|grep|cat): ", text) is not None
    return ToolResult(text, argument, failed)


def _literals(pattern: str) -> list[str]:
    """The runs of plain text in a regular expression worth looking up (3 characters on)."""
    return [run.strip() for run in _SYNTAX.split(pattern) if len(run.strip()) >= 3]


def _shortened(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 1] + "…"
