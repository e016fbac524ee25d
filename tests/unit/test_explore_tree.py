"""The page tree an exploring model browses: addresses become folders and files."""

from __future__ import annotations

import pytest

from core.answer.explore.session import Bounds, check_settings
from core.answer.explore.tree import MAX_LISTED, PageTree, normal_path
from core.store.page_catalog import CatalogPage

PAGES = [
    CatalogPage(1, "/", "Home", None),
    CatalogPage(2, "/en/shipping", "Shipping", "en"),
    CatalogPage(3, "https://shop.example/en/shipping/", "Shipping (old site)", "en"),
    CatalogPage(4, "https://shop.example/en/faq.html?x=1", "FAQ", "en"),
    CatalogPage(5, "/en/shipping/belgium", "Delivery to Belgium", "en"),
    CatalogPage(6, "/nl/verzending%20kosten", "Verzendkosten", "nl"),
    CatalogPage(7, "/docs/../../etc/passwd", "Odd", None),
]


def test_addresses_become_folders_and_files() -> None:
    tree = PageTree(PAGES)
    assert tree.ls("/").split("\n") == ["docs/", "en/", "nl/", "index.md (Home)"]
    assert tree.path_of(7) == "/docs/_/_/etc/passwd.md"  # ".." in an address is a name
    # A page and a folder may share a name; two addresses with one name are numbered.
    assert tree.ls("en").split("\n") == [
        "shipping/",
        "faq.md (FAQ)",
        "shipping-2.md (Shipping (old site))",
        "shipping.md (Shipping)",
    ]
    assert tree.ls("/en/shipping/") == "belgium.md (Delivery to Belgium)"
    assert tree.ls("/nl") == "verzending-kosten.md (Verzendkosten)"
    assert tree.ls("/en/faq.md") == "faq.md (FAQ)"
    assert tree.ls("/fr") == "ls: /fr: no such file or folder"
    # A page is found by its file, its file without .md, or its own address.
    for given in ("/en/shipping.md", "en/shipping", "/en/shipping", " '/en//shipping.md' "):
        file = tree.file(given)
        assert file is not None, given
        assert file.page.id == 2, given
    old = tree.file("https://shop.example/en/shipping/")
    assert old is not None
    assert old.path == "/en/shipping-2.md"
    assert tree.file("/en/shipping/") is not None  # the folder's name, read as the page
    assert tree.file("/en") is None
    assert tree.file("/missing.md") is None
    # Nothing climbs above the root.
    assert normal_path("../../etc") == "/etc"
    assert normal_path("//en//") == "/en"
    assert [f.page.id for f in tree.under("/en") or []] == [2, 3, 4, 5]
    assert tree.under("/en/faq.md") is not None
    assert tree.under("/fr") is None
    assert tree.path_of(5) == "/en/shipping/belgium.md"


def test_find_matches_names_and_titles_and_ls_is_bounded() -> None:
    tree = PageTree(PAGES)
    assert tree.find("SHIP").split("\n") == [
        "/en/shipping/",
        "/en/shipping-2.md",
        "/en/shipping.md",
    ]
    assert tree.find("belgium") == "/en/shipping/belgium.md"  # by its title
    assert tree.find("nothing") == "find: nothing is named like 'nothing'"
    assert tree.find("  ") == "find: give part of a name"
    many = PageTree([CatalogPage(i, f"/p/{i:04}", f"Page {i}", None) for i in range(150)])
    listed = many.ls("/p").split("\n")
    assert len(listed) == MAX_LISTED + 1
    assert listed[-1] == f"… and {150 - MAX_LISTED} more"


def test_exploration_settings_are_checked_and_bounded() -> None:
    check_settings({"exploration": True, "exploration_steps": 3, "exploration_seconds": 12.5})
    for wrong in (
        {"exploration": "yes"},
        {"exploration_steps": 0},
        {"exploration_steps": 2.5},
        {"exploration_seconds": 600},
        {"exploration_seconds": True},
    ):
        with pytest.raises(ValueError, match="exploration"):
            check_settings(wrong)
    assert Bounds.of({}) == Bounds(8, 20.0)
    assert Bounds.of({"exploration_steps": 99, "exploration_seconds": 0.1}) == Bounds(20, 1.0)
    assert Bounds.of({"exploration_steps": "4", "exploration_seconds": None}) == Bounds(8, 20.0)
