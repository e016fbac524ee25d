"""Chunks follow headings and paragraphs, keep their heading path and overlap a little."""

from __future__ import annotations

import itertools

from core.documents import Document
from core.knowledge.chunk import MAX_WORDS, TARGET_WORDS, chunk_document


def _doc(text: str, title: str = "Shipping") -> Document:
    return Document(url="/en/shipping", title=title, text=text)


def test_sections_never_mix_and_carry_their_heading_path() -> None:
    chunks = chunk_document(
        _doc(
            "# Shipping\nWe ship daily.\n\n## Netherlands\nOne to two days.\n\n"
            "### Islands\nThree days to the Wadden islands.\n\n## Belgium\nTwo to three days.\n"
        )
    )
    assert [(c.heading, c.text) for c in chunks] == [
        ("Shipping", "We ship daily."),
        ("Shipping > Netherlands", "One to two days."),
        ("Shipping > Netherlands > Islands", "Three days to the Wadden islands."),
        ("Shipping > Belgium", "Two to three days."),
    ]
    assert [c.ord for c in chunks] == [0, 1, 2, 3]


def test_the_title_leads_the_path_when_the_page_has_no_h1() -> None:
    [chunk] = chunk_document(_doc("## Costs\nFree above 50 euro.", title="Delivery"))
    assert chunk.heading == "Delivery > Costs"
    assert chunk.embedding_input() == "Delivery > Costs\nFree above 50 euro."


def test_long_sections_split_between_sentences_with_overlap() -> None:
    sentences = " ".join(f"Sentence {i} tells the visitor something useful." for i in range(120))
    chunks = chunk_document(_doc(f"# Shipping\n{sentences}"))
    assert len(chunks) > 2
    for chunk in chunks:
        assert len(chunk.text.split()) <= MAX_WORDS
        assert chunk.text.endswith(".")  # never cut inside a sentence
    for before, after in itertools.pairwise(chunks):
        last_sentence = before.text.rsplit("Sentence ", 1)[1]
        assert f"Sentence {last_sentence}" in after.text  # overlap carries context over
    all_text = " ".join(c.text for c in chunks)
    assert all(f"Sentence {i} " in all_text for i in range(120))


def test_paragraphs_are_packed_up_to_the_target() -> None:
    paragraphs = "\n\n".join("Short paragraph about returns." for _ in range(60))
    chunks = chunk_document(_doc(paragraphs, title="Returns"))
    assert len(chunks) >= 2
    assert all(len(c.text.split()) <= TARGET_WORDS + 40 for c in chunks)


def test_list_items_and_table_rows_stay_whole() -> None:
    [chunk] = chunk_document(
        _doc("## Sizes\n| EU | UK |\n| 42 | 8 |\n- free exchange\n- 30 days", title="Sizes")
    )
    assert chunk.text.splitlines() == ["| EU | UK |", "| 42 | 8 |", "- free exchange", "- 30 days"]


def test_an_empty_page_gives_no_chunks_but_a_titled_one_gives_its_title() -> None:
    assert chunk_document(_doc("", title="")) == []
    [chunk] = chunk_document(_doc("   ", title="Gift cards"))
    assert chunk.text == "Gift cards"
