"""Reading local sources: a directory of .md/.html/.txt files, one such file, or a .jsonl file."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.documents import Document, ReadError
from core.errors import InvalidInput
from core.knowledge.classify import infer_page_type
from core.knowledge.crawl import Unchanged
from core.knowledge.extract import extract_page, normalise_url
from core.locale import resolve_locale
from core.tags import normalise_tags

log = logging.getLogger(__name__)

SourceKind = Literal["directory", "file", "jsonl", "url", "sitemap", "text"]
TEXT_SUFFIXES = (".md", ".markdown", ".txt")
HTML_SUFFIXES = (".html", ".htm")
MAX_FILE_BYTES = 5_000_000
# Part of every file's fingerprint: change it when reading the same bytes would give another
# page (the extraction changed), so that the next ingest reads every file again.
READER_VERSION = "1"

# What the index holds of each page it read from a file: url -> the file's fingerprint.
Fingerprints = Mapping[str, str | None]


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Where content comes from: ``location`` is an absolute path or an http(s) URL; for
    pasted ``text`` it is the URL the text is cited under."""

    kind: SourceKind
    location: str
    text: str | None = None  # kind "text" only

    @property
    def is_remote(self) -> bool:
        return self.kind in ("url", "sitemap")


def parse_source(argument: str) -> SourceSpec:
    """What `parley ingest` was pointed at."""
    if argument.startswith(("http://", "https://")):
        if not urlsplit(argument).hostname:
            raise InvalidInput(f"{argument!r} is not a valid URL")
        kind: SourceKind = "sitemap" if urlsplit(argument).path.endswith(".xml") else "url"
        # One site, one source: "https://Shop.example" and "https://shop.example/" are the
        # same address, and a second try must update the first one's row, not add another.
        return SourceSpec(kind, normalise_url(argument))
    path = Path(argument).expanduser().resolve()
    if path.is_dir():
        return SourceSpec("directory", str(path))
    if path.suffix == ".jsonl" and path.is_file():
        return SourceSpec("jsonl", str(path))
    if path.suffix.lower() in TEXT_SUFFIXES + HTML_SUFFIXES and path.is_file():
        return SourceSpec("file", str(path))
    if not path.exists():
        raise InvalidInput(f"{argument}: no such file or directory")
    raise InvalidInput(
        f"{argument}: expected a directory, a .jsonl file, a .md/.html/.txt file or an http(s) URL"
    )


class JsonlPage(BaseModel):
    """One line of a .jsonl source."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    url: str = Field(min_length=1)
    title: str = ""
    text: str = Field(min_length=1)
    lang: str | None = None
    tags: object = Field(default_factory=list)  # checked apart: a bad tag stops the ingest
    visibility: Literal["public", "internal"] = "public"
    page_type: str | None = None


def _title_of_markdown(text: str, fallback: str) -> str:
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
        if line.strip():
            break
    return fallback


def _url_for(root: Path, path: Path, base_url: str | None) -> str:
    relative = path.relative_to(root).as_posix()
    return f"{base_url.rstrip('/')}/{relative}" if base_url else f"/{relative}"


def fingerprint(raw: bytes) -> str:
    """A file's bytes in short, kept as the page's ETag: a file that still has it is the
    page as indexed, without reading it again."""
    return f'"{READER_VERSION}-{hashlib.sha256(raw).hexdigest()[:32]}"'


def read_file(path: Path, url: str, known: str | None = None) -> Document | ReadError | Unchanged:
    """One .md/.txt/.html file as a page; unreadable files become a `ReadError`, and a file
    whose fingerprint is ``known`` (the page's, as indexed) is `Unchanged`."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return ReadError(str(path), f"larger than {MAX_FILE_BYTES // 1_000_000} MB", url)
        raw = path.read_bytes()
    except OSError as exc:
        return ReadError(str(path), exc.strerror or type(exc).__name__, url)
    etag = fingerprint(raw)
    if etag == known:
        return Unchanged(url)
    if path.suffix.lower() in HTML_SUFFIXES:
        page = extract_page(raw, url)
        return page if isinstance(page, ReadError) else replace(page, etag=etag)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ReadError(str(path), f"not UTF-8 text (byte {exc.start})", url)
    title = _title_of_markdown(text, path.stem.replace("-", " ").replace("_", " ").title())
    return Document(
        url=url,
        title=title,
        text=text,
        locale=resolve_locale(url, None, text),
        page_type=infer_page_type(url, title),
        etag=etag,
    )


def read_text(url: str, text: str) -> Document | ReadError:
    """Text staff pasted in (Markdown; a leading "# " line is its title), cited as ``url``."""
    if not text.strip():
        return ReadError(url, "no text", url)
    title = _title_of_markdown(text, url.rstrip("/").rsplit("/", 1)[-1].replace("-", " "))
    return Document(
        url=url,
        title=title,
        text=text,
        locale=resolve_locale(url, None, text),
        page_type=infer_page_type(url, title),
    )


def read_directory(
    root: Path, base_url: str | None = None, known: Fingerprints | None = None
) -> Iterator[Document | ReadError | Unchanged]:
    """Every .md/.html/.txt file under ``root``, in a stable order; hidden folders skipped.
    Files whose fingerprint ``known`` holds for their page are `Unchanged`.

    Nothing outside ``root`` is read: a file whose real path lies outside it (a symbolic
    link, or a file in a linked folder) and a linked folder that leaves it are reported as
    skipped, so a link to ``/etc`` or a home folder never becomes public content. Linked
    folders are not descended into (rglob does not follow them); their files inside
    ``root`` are read where they really are."""
    suffixes = TEXT_SUFFIXES + HTML_SUFFIXES
    inside = root.resolve()
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts):
            continue
        wanted = path.suffix.lower() in suffixes
        if not (wanted or (path.is_symlink() and path.is_dir())):
            continue
        try:
            real = path.resolve()
        except (OSError, RuntimeError):  # a loop of links
            yield ReadError(str(path), "skipped: a loop of symbolic links")
            continue
        if not real.is_relative_to(inside):
            # No url: a page once read through this link is removed, not kept as it was.
            yield ReadError(str(path), "skipped: links outside the folder")
        elif wanted and (path.is_file() or path.is_symlink()):
            url = _url_for(root, path, base_url)
            yield read_file(path, url, (known or {}).get(url))


def read_jsonl(path: Path) -> Iterator[Document | ReadError]:
    """Pages of a .jsonl file; a malformed line is reported with its line number and skipped.
    A line with a tag that is none stops the reading (`InvalidInput` naming the line): a
    page read without its tags could answer where its tags were meant to keep it out."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        yield ReadError(str(path), exc.strerror or type(exc).__name__)
        return
    with handle:
        number = 0
        while True:
            number += 1
            try:
                line = handle.readline()
            except UnicodeDecodeError:
                yield ReadError(f"{path}:{number}", "not UTF-8 text")
                continue
            if not line:
                return
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                yield ReadError(f"{path}:{number}", f"invalid JSON ({exc.msg})")
                continue
            try:
                page = JsonlPage.model_validate(data)
            except ValidationError as exc:
                problem = exc.errors()[0]
                field = ".".join(str(p) for p in problem["loc"]) or "line"
                url = data.get("url") if isinstance(data, dict) else None
                yield ReadError(
                    f"{path}:{number}",
                    f"{field}: {problem['msg']}",
                    url if isinstance(url, str) else None,
                )
                continue
            if not isinstance(page.tags, list):
                raise InvalidInput(f'{path}:{number}: tags: give a list such as ["pricing"]')
            tags = normalise_tags(page.tags, what=f"{path}:{number}: tags")
            title = page.title or _title_of_markdown(page.text, page.url)
            yield Document(
                url=page.url,
                title=title,
                text=page.text,
                locale=resolve_locale(page.url, page.lang, page.text),
                tags=tags,
                visibility=page.visibility,
                page_type=page.page_type or infer_page_type(page.url, title),
            )


def read_local(
    spec: SourceSpec, base_url: str | None = None, known: Fingerprints | None = None
) -> Iterator[Document | ReadError | Unchanged]:
    """The source's pages; ``known``: the fingerprints of the files its pages were read
    from, so that unchanged files are not read again."""
    path = Path(spec.location)
    if spec.kind == "directory":
        yield from read_directory(path, base_url, known)
    elif spec.kind == "jsonl":
        yield from read_jsonl(path)
    elif spec.kind == "file":
        url = _url_for(path.parent, path, base_url)
        yield read_file(path, url, (known or {}).get(url))
    elif spec.kind == "text":
        yield read_text(spec.location, spec.text or "")
    else:
        raise ValueError(f"{spec.kind} is not a local source")
