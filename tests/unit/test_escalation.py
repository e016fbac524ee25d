"""Recognising a request for a person, business hours and the handoff texts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.answer.escalation import (
    DEFAULT_HANDOFF_TEXTS,
    DEFAULT_OUT_OF_HOURS_TEXTS,
    HandoffPolicy,
    asks_for_person,
    parse_business_hours,
    validate_handoff_settings,
)
from core.errors import InvalidInput

ASKS = [
    # en
    "can I talk to a human",
    "Can I talk to a human?",
    "HUMAN",
    "human please",
    "agent",
    "Agent!!",
    "I want a real person",
    "I need help from a human",
    "Is there a human I can talk to?",
    "Is there someone I can talk to?",
    "Can I speak to someone please",
    "I'd like to speak with a representative",
    "connect me with a live agent",
    "Transfer me to an operator",
    "Can I chat with a person?",
    "Not sure this helps, can I talk to a human?",
    "Hi, I ordered shoes last week and now I want to talk to a real person about it",
    "Can I speak to the manager",
    "is an agent available?",
    # nl
    "mens",
    "medewerker",
    "Een medewerker graag",
    "Ik wil een mens spreken",
    "Kan ik een medewerker spreken?",
    "kan ik iemand spreken",
    "Kan ik even met een medewerker van jullie praten?",
    "Ik wil graag met een echt persoon chatten",
    "is er een medewerker beschikbaar?",
    # de
    "Mitarbeiter",
    "Mitarbeiter bitte",
    "Ich möchte mit einem Menschen sprechen",
    "Kann ich mit jemandem sprechen?",
    "Mensch, ich will endlich mit jemandem sprechen!",
    "Kann mir ein Mensch helfen?",
    "Bitte verbinden Sie mich mit einem Mitarbeiter",
    "Ich brauche einen echten Menschen",
    # fr
    "humain",
    "un humain svp",
    "Je veux parler à un conseiller",
    "Puis-je parler à un humain ?",
    "Je voudrais parler à quelqu’un",
    "Je voudrais parler à une vraie personne",
    "Passez-moi un conseiller s'il vous plaît",
    # es
    "humano por favor",
    "Quiero hablar con un agente",
    "¿Puedo hablar con una persona real?",
    "¿Puedo hablar con alguien?",
    "Necesito un asesor",
    "¿Hay un agente disponible?",
]

DOES_NOT_ASK = [
    "",
    "How long does delivery to Belgium take?",
    "What is your user agent policy?",
    "Where can I find the human resources policy?",
    "Can I talk to human resources?",
    "Is this jacket made for humans or dogs?",
    "Do you need a human signature on delivery?",
    "I am a travel agent, do you offer B2B prices?",
    "Are you a human?",
    "Am I talking to a human?",
    "Is this chat a human or a bot?",
    "I don't want to talk to a human, just tell me the price",
    "Can someone tell me when my order ships?",
    "Will someone contact me about my return?",
    "How can I contact you?",
    "The agent told me I could contact you about the refund",
    "How much is the tour per person?",
    "Do staff speak English?",
    "Hoeveel medewerkers werken er bij jullie?",
    "Is dit product veilig voor mens en dier?",
    "Ik wil geen medewerker spreken, alleen de prijs weten",
    "Mensch, wo bleibt mein Paket?",
    "Gibt es einen Mitarbeiterrabatt?",
    "Ich will nicht mit einem Menschen sprechen",
    "Le conseiller m'a dit que le colis arrivait lundi",
    "Je ne veux pas parler à un humain",
    "El agente de aduanas retuvo mi paquete",
    "Does the human hair wig come in blonde?",
]


@pytest.mark.parametrize("text", ASKS)
def test_a_request_for_a_person_is_recognised(text: str) -> None:
    assert asks_for_person(text)


@pytest.mark.parametrize("text", DOES_NOT_ASK)
def test_other_messages_are_not_a_request_for_a_person(text: str) -> None:
    assert not asks_for_person(text)


HOURS = {"mon": ["09:00-12:00", "13:00-17:30"], "fri": "09:00-17:00", "sat": "22:00-02:00"}


@pytest.mark.parametrize(
    ("moment", "open_"),
    [
        # Monday 6 May 2024, Europe/Amsterdam is UTC+2 in summer
        (datetime(2024, 5, 6, 7, 0, tzinfo=UTC), True),  # 09:00 local
        (datetime(2024, 5, 6, 6, 59, tzinfo=UTC), False),  # 08:59 local
        (datetime(2024, 5, 6, 10, 30, tzinfo=UTC), False),  # lunch, 12:30 local
        (datetime(2024, 5, 6, 15, 29, tzinfo=UTC), True),  # 17:29 local
        (datetime(2024, 5, 6, 15, 30, tzinfo=UTC), False),  # 17:30 local: closed
        (datetime(2024, 5, 7, 9, 0, tzinfo=UTC), False),  # Tuesday: not listed, closed
        (datetime(2024, 5, 11, 21, 0, tzinfo=UTC), True),  # Saturday 23:00 local
        (datetime(2024, 5, 11, 23, 30, tzinfo=UTC), True),  # Sunday 01:30 local, from Saturday
        (datetime(2024, 5, 12, 0, 0, tzinfo=UTC), False),  # Sunday 02:00 local
    ],
)
def test_business_hours_in_the_agents_timezone(moment: datetime, open_: bool) -> None:
    policy = HandoffPolicy.of({"business_hours": HOURS}, "Europe/Amsterdam", "en")
    assert policy.staffed(moment) is open_
    text, staffed = policy.reply("en", moment)
    assert staffed is open_
    expected = DEFAULT_HANDOFF_TEXTS if open_ else DEFAULT_OUT_OF_HOURS_TEXTS
    assert text == expected["en"]


def test_no_hours_means_always_staffed_and_a_full_day_parses() -> None:
    assert HandoffPolicy.of({}, "UTC", "en").staffed(datetime(2024, 5, 5, 3, tzinfo=UTC))
    hours = parse_business_hours({"sun": "00:00-24:00", "mon": "closed"})
    assert hours is not None
    assert hours.open_at(datetime(2024, 5, 5, 23, 59))
    assert not hours.open_at(datetime(2024, 5, 6, 12, 0))


def test_texts_follow_the_language_then_the_agents_then_english() -> None:
    now = datetime(2024, 5, 6, 12, tzinfo=UTC)
    built_in = HandoffPolicy.of({}, "UTC", "de")
    assert built_in.reply("nl", now)[0] == DEFAULT_HANDOFF_TEXTS["nl"]
    assert built_in.reply("pt", now)[0] == DEFAULT_HANDOFF_TEXTS["de"]
    own = HandoffPolicy.of({"handoff_text": {"nl": "Even geduld!", "en": "Hold on!"}}, "UTC", "nl")
    assert own.reply("nl", now)[0] == "Even geduld!"
    assert own.reply("fr", now)[0] == "Even geduld!"
    single = HandoffPolicy.of({"handoff_text": "One moment."}, "UTC", "en")
    assert single.reply("de", now)[0] == "One moment."


@pytest.mark.parametrize(
    "settings",
    [
        {"business_hours": {"monday": "09:00-17:00"}},
        {"business_hours": {"mon": "9-5"}},
        {"business_hours": {"mon": "09:00-25:00"}},
        {"business_hours": {"mon": "09:00-09:00"}},
        {"business_hours": ["09:00-17:00"]},
        {"handoff_text": 3},
        {"out_of_hours_text": {"en": ["x"]}},
        {"handoff_enabled": "no"},
    ],
)
def test_bad_handoff_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        validate_handoff_settings(settings)


def test_good_handoff_settings_pass() -> None:
    validate_handoff_settings(
        {
            "business_hours": {"mon": ["08:30-12:00", "13:00-17:00"], "sun": []},
            "handoff_text": {"en": "A colleague joins shortly."},
            "out_of_hours_text": "We are closed.",
            "handoff_enabled": False,
        }
    )
