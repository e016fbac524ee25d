"""Countries named in a question, and the regions of a table that cover them."""

import pytest

from core.answer.places import country, region_holds


@pytest.mark.parametrize(
    ("word", "code"),
    [("Austria", "AT"), ("oostenrijk", "AT"), ("Österreich", "AT"), ("Autriche", "AT"),
     ("Polen", "PL"), ("Noorwegen", "NO"), ("shipping", None), ("live", None), ("de", None)],
)  # fmt: skip
def test_a_country_is_known_by_its_name_in_each_language(word: str, code: str | None) -> None:
    assert country(word) == code


def test_the_eu_row_covers_members_only() -> None:
    assert region_holds("AT", "Destination: Other EU countries; DHL")
    assert region_holds("AT", "Ziel: Übrige EU-Länder")
    assert not region_holds("NO", "Destination: Other EU countries; DHL")
    assert not region_holds("AT", "Destination: Germany; DHL")


def test_a_worldwide_row_covers_every_country() -> None:
    assert region_holds("NO", "Rest of the world: 10-14 days")
    assert region_holds("JP", "Wereldwijd: € 25")
