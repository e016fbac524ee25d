#!/usr/bin/env python3
"""Build faq.jsonl from the raw Corona-Warn-App website FAQ JSON files.

Standard library only, deterministic. Reads raw/faq.json (en) and
raw/faq_de.json (de) next to this script and writes faq.jsonl next to it.

Usage: python3 build.py
"""

import html
import json
import os
import re
import sys
from html.parser import HTMLParser

HERE = os.path.dirname(os.path.abspath(__file__))
RAW = {"en": os.path.join(HERE, "raw", "faq.json"), "de": os.path.join(HERE, "raw", "faq_de.json")}
OUT = os.path.join(HERE, "faq.jsonl")
URL = "https://www.coronawarn.app/{lang}/faq/#{anchor}"

BLOCK_TAGS = {
    "p",
    "div",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "tr",
    "table",
    "thead",
    "tbody",
    "figure",
    "figcaption",
    "hr",
    "br",
    "video",
}


class _TextExtractor(HTMLParser):
    """HTML -> plain text: <li> as '- ' lines, links reduced to their text,
    other tags stripped, entities unescaped (convert_charrefs)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.list_depth = 0
        self.cell_in_row = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("ul", "ol"):
            self.list_depth += 1
            self.out.append("\n")
        elif tag == "li":
            indent = "  " * max(self.list_depth - 1, 0)
            self.out.append("\n" + indent + "- ")
        elif tag == "tr":
            self.cell_in_row = 0
            self.out.append("\n")
        elif tag in ("td", "th"):
            if self.cell_in_row:
                self.out.append(" | ")
            self.cell_in_row += 1
        elif tag in BLOCK_TAGS:
            self.out.append("\n")
        # everything else (a, b, i, q, em, img, span, ...) is stripped

    def handle_startendtag(self, tag, attrs):
        # <br/>, <hr/>, <a/> ... : only layout tags matter
        if tag in BLOCK_TAGS:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag in ("ul", "ol"):
            self.list_depth = max(self.list_depth - 1, 0)
            self.out.append("\n")
        elif tag == "li" or tag in BLOCK_TAGS:
            self.out.append("\n")

    def handle_data(self, data):
        self.out.append(data)


def html_to_text(fragment):
    p = _TextExtractor()
    p.feed(fragment)
    p.close()
    text = "".join(p.out)
    text = text.replace("\u00ad", "").replace("\u00a0", " ")
    lines = []
    for line in text.split("\n"):
        m = re.match(r"^( *)(.*)$", line)
        lead, rest = m.group(1), re.sub(r"[ \t]+", " ", m.group(2)).strip()
        if not rest:
            continue
        # keep list indentation ("  - ") but drop other leading blanks
        if rest.startswith("- ") or rest == "-":
            lines.append(lead + rest)
        else:
            lines.append(rest)
    return "\n".join(lines).strip()


def one_line(fragment):
    return re.sub(r"\s+", " ", html_to_text(fragment)).strip()


def plain_title(s):
    return re.sub(r"\s+", " ", html.unescape(s or "").replace("\u00ad", "")).strip()


# --- trailing cross-reference blocks -------------------------------------
# Rule A (as briefed): a block whose text starts with "See FAQ:", "See also
# FAQ:", "Siehe FAQ:" (plus the German form "Siehe auch FAQ..." that the DE
# file uses where EN says "See also FAQ").
XREF_A = re.compile(r"^(See (also )?FAQ|Siehe (auch )?FAQ)\b")
# Rule B: a "See also"/"Siehe auch"/"Related FAQ articles" lead-in followed
# only by in-page links (href="#..."), i.e. a pure list of links to other
# FAQ entries / glossary terms, with no other text.
XREF_B_LEAD = re.compile(r"^(See also|Siehe auch|Related FAQ articles)\b")
FILLER = {
    "see",
    "also",
    "siehe",
    "auch",
    "related",
    "faq",
    "articles",
    "article",
    "artikel",
    "den",
    "the",
    "entry",
    "eintrag",
}
HREF = re.compile(r"""<a\b[^>]*?href\s*=\s*['"]?([^'" >]*)""", re.I)
ANCHOR_TEXT = re.compile(r"<a\b[^>]*>(.*?)</a>", re.I | re.S)


def xref_rule(block):
    text = one_line(block)
    if XREF_A.match(text):
        return "A"
    if XREF_B_LEAD.match(text):
        hrefs = HREF.findall(block)
        if hrefs and all(h.startswith("#") for h in hrefs):
            rest = ANCHOR_TEXT.sub(" ", block)
            words = re.findall(r"\w+", one_line(rest).lower())
            if all(w in FILLER for w in words):
                return "B"
    return None


def iter_accordions(node, topic=None, section=None):
    """Yield (topic_title, section_title, accordion_item) for every accordion
    list found anywhere in the JSON tree, in document order."""
    if isinstance(node, dict):
        if isinstance(node.get("sections"), list):  # a topic
            topic = node.get("title", topic)
        if isinstance(node.get("accordion"), list):  # a section
            sec = node.get("title", section)
            for item in node["accordion"]:
                yield topic, sec, item
        for key, value in node.items():
            if key == "accordion":
                continue
            yield from iter_accordions(value, topic, section)
    elif isinstance(node, list):
        for value in node:
            yield from iter_accordions(value, topic, section)


def build_lang(lang, stats):
    with open(RAW[lang], encoding="utf-8") as f:
        data = json.load(f)
    records, seen = [], set()
    for topic, section, item in iter_accordions(data):
        if not isinstance(item, dict) or "anchor" not in item:
            stats["skipped_duplicate_refs"][lang] += 1  # {"duplicate": ...}
            continue
        anchor = item["anchor"]
        if anchor in seen:
            stats["skipped_repeated_anchor"][lang] += 1
            continue
        seen.add(anchor)
        blocks = [b for b in item.get("textblock", []) if isinstance(b, str)]
        while len(blocks) > 1:
            rule = xref_rule(blocks[-1])
            if not rule:
                break
            stats["dropped_xref_blocks_rule_" + rule][lang] += 1
            blocks.pop()
        parts = [t for t in (html_to_text(b) for b in blocks) if t]
        answer = "\n\n".join(parts)
        if not answer:
            stats["empty_answer"][lang] += 1
        records.append(
            {
                "id": anchor,
                "lang": lang,
                "topic": plain_title(topic),
                "section": plain_title(section),
                "question": one_line(item.get("title", "")),
                "answer": answer,
                "url": URL.format(lang=lang, anchor=anchor),
            }
        )
    glossary = 0
    for letter in (data.get("glossary", {}).get("glossaryWords", {}) or {}).values():
        glossary += len(letter)
    stats["glossary_terms_not_included"][lang] = glossary
    return records


def main():
    keys = [
        "skipped_duplicate_refs",
        "skipped_repeated_anchor",
        "dropped_xref_blocks_rule_A",
        "dropped_xref_blocks_rule_B",
        "empty_answer",
        "glossary_terms_not_included",
    ]
    stats = {k: {"en": 0, "de": 0} for k in keys}
    out = {lang: build_lang(lang, stats) for lang in ("en", "de")}
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        for lang in ("en", "de"):
            for rec in out[lang]:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    en_ids = {r["id"] for r in out["en"]}
    de_ids = {r["id"] for r in out["de"]}
    print(
        "records: en=%d de=%d total=%d"
        % (len(out["en"]), len(out["de"]), len(out["en"]) + len(out["de"]))
    )
    print("parallel anchors (in both): %d" % len(en_ids & de_ids))
    print("en only: %s" % sorted(en_ids - de_ids))
    print("de only: %s" % sorted(de_ids - en_ids))
    for k in keys:
        print("%s: en=%d de=%d" % (k, stats[k]["en"], stats[k]["de"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
