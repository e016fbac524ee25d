"""What related reading never offers: a site's front page, or a language's."""

from __future__ import annotations

import pytest

from core.answer.related import is_front_page


@pytest.mark.parametrize(
    "url",
    ["/", "", "/nl/", "/de/index.html", "https://shop.example/", "https://shop.example/en",
     "/index.htm", "/pt-BR/"],
)  # fmt: skip
def test_front_pages_are_nothing_to_read_on(url: str) -> None:
    assert is_front_page(url)


@pytest.mark.parametrize(
    "url",
    ["/warranty.html", "/en/faq.html", "/nl/verzending.html", "https://shop.example/en/returns",
     "/blog/", "/en/products/index.html"],
)  # fmt: skip
def test_other_pages_may_be_offered(url: str) -> None:
    assert not is_front_page(url)
