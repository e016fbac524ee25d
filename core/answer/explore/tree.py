"""The agent's pages as a read-only file tree: `/en/shipping` is the file `/en/shipping.md`."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from core.store.page_catalog import CatalogPage

MAX_LISTED = 100  # entries `ls` shows of one folder
MAX_FOUND = 30  # paths `find` shows

# Extensions a page's address may end in; the file is named without them.
_PAGE_EXTENSIONS = re.compile(r"\.(?:s?html?|php|aspx?|jsp|md|markdown|txt)$", re.IGNORECASE)
_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f]+")


@dataclass(frozen=True, slots=True)
class PageFile:
    path: str  # "/en/shipping.md"
    page: CatalogPage

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def _segment(raw: str) -> str:
    """A path segment of an address as a name in the tree: decoded, no spaces, never "."."""
    name = _UNSAFE.sub("-", unquote(raw)).strip("-")
    return "_" if name in ("", ".", "..") else name


def _parts(url: str) -> tuple[list[str], str]:
    """The folders and the file's stem of a page's address (absolute or root-relative)."""
    segments = [_segment(s) for s in urlsplit(url).path.split("/") if s]
    if not segments:
        return [], "index"
    stem = _PAGE_EXTENSIONS.sub("", segments[-1]) or "index"
    return segments[:-1], stem


def normal_path(path: str) -> str:
    """What the model typed as an absolute path in the tree: "en/faq" and "/en//faq/" are
    "/en/faq"; "." and ".." are followed but never above the root."""
    cleaned = re.sub(r"/+", "/", "/" + path.strip().strip("'\"`"))
    return posixpath.normpath(cleaned) if cleaned != "/" else "/"


class PageTree:
    """The files (pages) and folders the model may see; nothing else exists for it."""

    def __init__(self, pages: Sequence[CatalogPage]) -> None:
        self._files: dict[str, PageFile] = {}
        self._by_url: dict[str, PageFile] = {}
        self._folders: dict[str, set[str]] = {"/": set()}  # folder -> child folder names
        self._folder_files: dict[str, list[PageFile]] = {}  # folder -> the files in it
        for page in pages:
            folders, stem = _parts(page.url)
            parent = "/"
            for folder in folders:
                self._folders.setdefault(parent, set()).add(folder)
                parent = posixpath.join(parent, folder)
                self._folders.setdefault(parent, set())
            path = posixpath.join(parent, f"{stem}.md")
            number = 2
            while path in self._files:  # two addresses, one name: the later one is numbered
                path = posixpath.join(parent, f"{stem}-{number}.md")
                number += 1
            file = PageFile(path, page)
            self._files[path] = file
            self._folder_files.setdefault(parent, []).append(file)
            self._by_url.setdefault(page.url, file)

    @property
    def files(self) -> list[PageFile]:
        return list(self._files.values())

    def __len__(self) -> int:
        return len(self._files)

    def file(self, path: str) -> PageFile | None:
        """The page at ``path``: its file ("/en/faq.md"), the file without ".md", or the
        page's own address ("/en/faq", "https://shop.example/en/faq")."""
        given = path.strip().strip("'\"`")
        if given in self._by_url:
            return self._by_url[given]
        normal = normal_path(given)
        return self._files.get(normal) or self._files.get(f"{normal}.md")

    def is_folder(self, path: str) -> bool:
        return normal_path(path) in self._folders

    def under(self, path: str) -> list[PageFile] | None:
        """The files in folder ``path`` and below it, or the one file at ``path``; None when
        neither exists."""
        normal = normal_path(path)
        if normal in self._folders:
            prefix = normal.rstrip("/") + "/"
            return [f for p, f in self._files.items() if p.startswith(prefix)]
        file = self.file(path)
        return [file] if file is not None else None

    def path_of(self, page_id: int) -> str | None:
        return next((p for p, f in self._files.items() if f.page.id == page_id), None)

    def ls(self, path: str = "/") -> str:
        """A folder's folders ("name/") and files ("name.md (Title)"), one a line."""
        normal = normal_path(path)
        if normal not in self._folders:
            file = self.file(path)
            if file is None:
                return f"ls: {normal}: no such file or folder"
            return _listed(file)
        folders = sorted(self._folders[normal], key=str.casefold)
        files = sorted(self._folder_files.get(normal, []), key=lambda f: f.name.casefold())
        lines = [f"{name}/" for name in folders] + [_listed(f) for f in files]
        if not lines:
            return f"ls: {normal}: empty folder"
        shown = lines[:MAX_LISTED]
        if len(lines) > len(shown):
            shown.append(f"… and {len(lines) - len(shown)} more")
        return "\n".join(shown)

    def find(self, name: str) -> str:
        """Folders and files whose name (or page title) contains ``name``, ignoring case."""
        wanted = name.strip().strip("'\"`*").casefold()
        if not wanted:
            return "find: give part of a name"
        folders = [
            f"{folder}/"
            for folder in self._folders
            if folder != "/" and wanted in posixpath.basename(folder).casefold()
        ]
        files = [
            path
            for path, file in self._files.items()
            if wanted in file.name.casefold() or wanted in file.page.title.casefold()
        ]
        found = sorted(folders) + sorted(files)
        if not found:
            return f"find: nothing is named like {name.strip()!r}"
        shown = found[:MAX_FOUND]
        if len(found) > len(shown):
            shown.append(f"… and {len(found) - len(shown)} more; try a longer name")
        return "\n".join(shown)


def _listed(file: PageFile) -> str:
    title = " ".join(file.page.title.split())
    return f"{file.name} ({title})" if title else file.name
