"""Splitting long replies: boundaries by preference, limits, and nothing lost or cut apart."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channels.delivery import split_message


def _assert_faithful(text: str, parts: list[str], limit: int) -> None:
    """Every part fits, none is empty or padded, and text = spaces + parts + spaces, in order."""
    position = 0
    for part in parts:
        assert 0 < len(part) <= limit
        assert part == part.strip()
        found = text.find(part, position)
        assert found >= 0, part
        assert text[position:found].strip() == ""
        position = found + len(part)
    assert text[position:].strip() == ""


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("", 10, []),
        ("   \n\n  ", 10, []),
        ("  hello  ", 10, ["hello"]),
        ("exactly ten", 11, ["exactly ten"]),
        # paragraph before sentence before word
        ("First para.\n\nSecond one is here.", 25, ["First para.", "Second one is here."]),
        ("Short one. Two three four.", 20, ["Short one.", "Two three four."]),
        ("Alpha beta. Gamma delta epsilon", 20, ["Alpha beta.", "Gamma delta epsilon"]),
        ("alpha beta gamma delta", 12, ["alpha beta", "gamma delta"]),
        # a sentence end that fills at least half a part beats a later word boundary...
        ("Some words here. And more words", 24, ["Some words here.", "And more words"]),
        # ...but a tiny paragraph does not make a tiny part when a sentence end is near
        ("Hi.\n\nThis is long. And more", 20, ["Hi.\n\nThis is long.", "And more"]),
        ("a\nb c d e f g", 8, ["a\nb c d", "e f g"]),
        # hard cut as a last resort
        ("abcdefghij", 4, ["abcd", "efgh", "ij"]),
        # CJK sentences have no space after the full stop
        ("今日は晴れです。明日は雨です。", 8, ["今日は晴れです。", "明日は雨です。"]),
    ],
)
def test_split_table(text: str, limit: int, expected: list[str]) -> None:
    assert split_message(text, limit) == expected


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit"):
        split_message("text", 0)


def test_entities_are_not_cut() -> None:
    text = "Tom&amp;Jerry&#128512;x"
    parts = split_message(text, 10)
    assert "".join(parts) == text
    for part in parts:
        assert re.fullmatch(r"[^&;]*(?:&(?:amp|#128512);[^&;]*)*", part), parts


def test_markdown_links_are_not_cut() -> None:
    text = "See [the returns page](https://shop.example/returns) for details and more"
    parts = split_message(text, 55)
    _assert_faithful(text, parts, 55)
    assert len(parts) == 2
    assert any("[the returns page](https://shop.example/returns)" in part for part in parts)


def test_a_link_longer_than_a_part_is_cut_at_its_words() -> None:
    text = "[a very long link text indeed](https://x.example/y)"
    parts = split_message(text, 20)
    _assert_faithful(text, parts, 20)
    assert parts[0] == "[a very long link"


CLUSTERS = [
    "👩\u200d👩\u200d👧\u200d👦",  # family: ZWJ sequence of 7 code points
    "👍🏽",  # skin-tone modifier
    "🇫🇷",  # flag: a pair of regional indicators
    "e\u0301",  # combining acute accent
    "❤\ufe0f",  # variation selector
    "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",  # Scotland, tags
]


# A cluster longer than a part has to be cut: that case has a test of its own below.
@pytest.mark.parametrize(
    ("cluster", "limit"),
    [(c, limit) for c in CLUSTERS for limit in (7, 8, 9, 10) if len(c) <= limit],
)
def test_grapheme_clusters_stay_whole(cluster: str, limit: int) -> None:
    text = cluster * 12
    parts = split_message(text, limit)
    assert "".join(parts) == text
    for part in parts:
        assert part == cluster * (len(part) // len(cluster)), parts


def test_an_emoji_outside_the_bmp_is_one_character() -> None:
    assert split_message("😀" * 5, 2) == ["😀😀", "😀😀", "😀"]


def test_a_cluster_longer_than_the_limit_is_cut_anyway() -> None:
    text = "a" + "\u0301" * 9
    parts = split_message(text, 4)
    assert "".join(parts) == text
    assert all(len(p) <= 4 for p in parts)


def _prose(sentences: int) -> str:
    paragraphs = []
    for p in range(0, sentences, 7):
        paragraphs.append(
            " ".join(
                f"Sentence {n} explains how returns, refunds & exchanges work for order {n}."
                for n in range(p, min(p + 7, sentences))
            )
        )
    return "\n\n".join(paragraphs)


@pytest.mark.parametrize("limit", [1600, 4096, 300])
def test_a_long_answer_splits_at_sentence_ends(limit: int) -> None:
    text = _prose(200)[:10_000].rsplit(".", 1)[0] + "."
    assert len(text) > 9_900
    parts = split_message(text, limit)
    _assert_faithful(text, parts, limit)
    assert len(parts) >= -(-len(text) // limit)
    assert all(part.endswith(".") for part in parts)
    numbers = [int(n) for n in re.findall(r"Sentence (\d+)", " ".join(parts))]
    assert numbers == sorted(numbers) == list(range(len(numbers)))


# -- properties ----------------------------------------------------------------------------

_TOKENS = [
    "word",
    "x",
    "longerword",
    "Hello,",
    "end.",
    "why?",
    "&amp;",
    "&#x1F600;",
    "[link text](https://e.example/a?b=c)",
    "https://shop.example/p/123",
    "😀",
    "👩\u200d💻",
    "👍🏿",
    "🇯🇵",
    "é",
    "e\u0301",
    "。",
    "日本",
]
# Tokens glued together form one longer "word", which may need a hard cut anywhere.
_SEPARATORS = [" ", " ", " ", "\n", "\n\n", "  \n \n", "\t", " \u3000"]
_LONGEST = max(len(t) for t in _TOKENS)
_TOKEN_RE = re.compile(
    "(?:" + "|".join(re.escape(t) for t in sorted(_TOKENS, key=len, reverse=True)) + r"|\s)+"
)


_texts = st.lists(
    st.tuples(st.sampled_from(_TOKENS), st.sampled_from(_SEPARATORS)), max_size=120
).map(lambda pairs: "".join(token + sep for token, sep in pairs))


@given(text=st.text(max_size=400), limit=st.integers(min_value=1, max_value=60))
@settings(max_examples=300, deadline=None)
def test_any_text_keeps_its_content_in_order(text: str, limit: int) -> None:
    parts = split_message(text, limit)
    _assert_faithful(text, parts, limit)
    assert "".join("".join(parts).split()) == "".join(text.split())


@given(text=_texts, limit=st.integers(min_value=_LONGEST, max_value=120))
@settings(max_examples=300, deadline=None)
def test_tokens_are_never_cut_when_they_fit(text: str, limit: int) -> None:
    parts = split_message(text, limit)
    _assert_faithful(text, parts, limit)
    for part in parts:
        assert _TOKEN_RE.fullmatch(part), (part, parts)


@given(
    words=st.lists(st.text(alphabet="abcdefghij", min_size=1, max_size=12), min_size=1),
    limit=st.integers(min_value=12, max_value=80),
)
@settings(max_examples=200, deadline=None)
def test_words_that_fit_are_never_cut(words: list[str], limit: int) -> None:
    parts = split_message(" ".join(words), limit)
    assert [w for part in parts for w in part.split()] == words


@given(
    text=st.text(min_size=1, max_size=700).map(lambda s: (s * (10_000 // len(s) + 1))[:10_000]),
    limit=st.sampled_from([1600, 4096]),
)
@settings(max_examples=10, deadline=None)
def test_ten_thousand_characters_split_into_ordered_parts(text: str, limit: int) -> None:
    parts = split_message(text, limit)
    _assert_faithful(text, parts, limit)
