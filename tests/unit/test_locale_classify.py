"""Locales from URLs, declared tags and text; policy topics and page types in four languages."""

from __future__ import annotations

import pytest

from core.knowledge.classify import POLICY_TOPICS, infer_page_type, policy_topic
from core.locale import (
    detect_language,
    language_of,
    locale_from_url,
    normalise_locale,
    resolve_locale,
)


@pytest.mark.parametrize(
    ("url", "locale"),
    [
        ("https://shop.example/en/shipping", "en"),
        ("https://shop.example/de-de/versand", "de-de"),
        ("https://shop.example/nl_BE/", "nl-be"),
        ("https://shop.example/FR/livraison", "fr"),
        ("https://shop.example/pt-BR", "pt-br"),
        ("/nl/retourneren", "nl"),
    ],
)
def test_locale_from_the_first_url_folder(url: str, locale: str) -> None:
    assert locale_from_url(url) == locale


@pytest.mark.parametrize(
    "url",
    [
        "https://shop.example/js/app.js",
        "https://shop.example/ui/button",
        "https://shop.example/api/v1/orders",
        "https://shop.example/",
        "https://shop.example",
        "https://shop.example/shipping",
        "https://shop.example/products/en/shoe",  # a language, but not in the first folder
        "https://shop.example/en-usa/",  # three-letter region
        "https://shop.example/xx-yy/",  # not ISO 639-1
        "https://shop.example/my/account",  # the account area, not Burmese
    ],
)
def test_folders_that_are_not_languages(url: str) -> None:
    assert locale_from_url(url) is None


def test_language_of_a_locale() -> None:
    assert language_of("de-de") == "de"
    assert language_of("nl_BE") == "nl"
    assert language_of("EN") == "en"


@pytest.mark.parametrize(
    ("declared", "locale"),
    [
        ("en_GB", "en-gb"),
        ("nl-BE", "nl-be"),
        ("DE", "de"),
        ("zh-Hant-TW", "zh-tw"),
        ("x-default", None),
        ("und", None),
        ("", None),
        (None, None),
    ],
)
def test_declared_language_is_normalised(declared: str | None, locale: str | None) -> None:
    assert normalise_locale(declared) == locale


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("Wij verzenden alle bestellingen binnen één werkdag vanuit ons magazijn.", "nl"),
        ("Kan ik mijn bestelling nog retourneren?", "nl"),
        ("Wir versenden alle Bestellungen innerhalb eines Werktages aus unserem Lager.", "de"),
        ("Wo ist mein Paket?", "de"),
        ("We ship every order within one working day from our warehouse.", "en"),
        ("Nous livrons toutes les commandes en vingt-quatre heures.", "fr"),
    ],
)
def test_detects_the_language_of_sentences(text: str, language: str) -> None:
    assert detect_language(text) == language


@pytest.mark.parametrize("text", ["", "ok", "Hallo", "SKU 12345-XL", "Trail Runner 2", "€ 49,95"])
def test_no_language_for_short_or_ambiguous_text(text: str) -> None:
    assert detect_language(text) is None


def test_resolve_locale_prefers_folder_then_declared_then_detection() -> None:
    dutch = "Wij verzenden alle bestellingen binnen één werkdag vanuit ons magazijn."
    assert resolve_locale("https://x.example/en/shipping", "nl-NL", dutch) == "en"
    assert resolve_locale("https://x.example/shipping", "nl_NL", "") == "nl-nl"
    assert resolve_locale("https://x.example/shipping", "x-default", dutch) == "nl"
    assert resolve_locale("https://x.example/shipping", None, dutch) == "nl"
    assert resolve_locale("https://x.example/shipping") is None


@pytest.mark.parametrize(
    ("question", "topic"),
    [
        ("How long does delivery take?", "shipping"),
        ("Wanneer wordt mijn pakket bezorgd?", "shipping"),
        ("Wie hoch sind die Versandkosten nach Österreich?", "shipping"),
        ("Quels sont les délais de livraison ?", "shipping"),
        ("Combien de temps pour l'expedition ?", "shipping"),  # typed without the accent
        ("Can I get a refund?", "returns"),
        ("Hoe kan ik mijn schoenen retourneren?", "returns"),
        ("Wie funktioniert die Rücksendung?", "returns"),
        ("Wie funktioniert die Rucksendung?", "returns"),
        ("Comment être remboursé ?", "returns"),
        ("Can I pay with PayPal?", "payment"),
        ("Kan ik achteraf betalen met Klarna?", "payment"),
        ("Kann ich auf Rechnung bestellen?", "payment"),
        ("Puis-je payer par carte bancaire ?", "payment"),
        ("Is there a warranty on the zipper?", "warranty"),
        ("Hoe lang is de garantie?", "warranty"),
        ("Mein Schuh ist defekt", "warranty"),
        ("La montre est en panne", "warranty"),
        ("What size should I order?", "sizes"),
        ("Welke maat moet ik nemen?", "sizes"),
        ("Welche Größe passt mir?", "sizes"),
        ("Quelle taille choisir ?", "sizes"),
    ],
)
def test_policy_topic_in_four_languages(question: str, topic: str) -> None:
    assert policy_topic(question) == topic


@pytest.mark.parametrize(
    "text",
    [
        "Do you have this jacket in blue?",
        "Habt ihr große Rabatte?",  # "large", not "Größe"
        "This is ideal for running",
        "A relationship built on trust",  # "ship" only counts at the start of a word
        "",
    ],
)
def test_no_policy_topic(text: str) -> None:
    assert policy_topic(text) is None


def test_topics_are_the_five_policies_with_lowercase_stems() -> None:
    assert list(POLICY_TOPICS) == ["shipping", "returns", "payment", "warranty", "sizes"]
    for stems in POLICY_TOPICS.values():
        assert stems
        assert all(stem == stem.lower().strip() for stem in stems)


@pytest.mark.parametrize(
    ("url", "title", "page_type"),
    [
        ("https://x.example/en/shipping", "Shipping", "policy"),
        ("https://x.example/nl/klantenservice/retourneren", "Retourneren", "policy"),
        ("https://x.example/info/page-12", "Versand und Lieferung", "policy"),
        ("https://x.example/privacy", "Privacy statement", "policy"),
        ("https://x.example/nl/algemene-voorwaarden", "Algemene voorwaarden", "policy"),
        ("https://x.example/de/agb", "AGB", "policy"),
        ("https://x.example/fr/cgv", "Conditions générales de vente", "policy"),
        ("https://x.example/faq", "Help", "faq"),
        ("https://x.example/nl/veelgestelde-vragen", "Veelgestelde vragen", "faq"),
        ("https://x.example/de/hilfe", "Häufige Fragen", "faq"),
        ("https://x.example/fr/aide", "Questions fréquentes", "faq"),
        ("https://x.example/contact", "Contact", "contact"),
        ("https://x.example/de/kontakt", "Kontakt", "contact"),
        ("https://x.example/nl/klantenservice", "Klantenservice", "contact"),
        ("https://x.example/about", "About us", "page"),
        ("https://x.example/nl/contactlenzen", "Contactlenzen", "page"),
    ],
)
def test_page_types(url: str, title: str, page_type: str) -> None:
    assert infer_page_type(url, title) == page_type


def test_product_data_makes_a_product_page() -> None:
    product = {"name": "Trail Runner 2", "sku": "TR-2"}
    assert infer_page_type("https://x.example/shipping-box", "Shipping box", product) == "product"
    assert infer_page_type("https://x.example/shipping-box", "Shipping box", {}) == "policy"
