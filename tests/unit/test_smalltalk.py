"""Small talk: whole messages of greetings, thanks or goodbyes, in the visitor's language."""

from __future__ import annotations

from core.answer.phrases import LANGUAGES, phrase
from core.answer.smalltalk import small_talk

SMALL_TALK = [
    ("hi", "greeting", "en"),
    ("Hello!", "greeting", "en"),
    ("hey there 👋", "greeting", "en"),
    ("Hiii", "greeting", "en"),
    ("Good morning", "greeting", "en"),
    ("hallo", "greeting", "nl"),
    ("Goedemorgen!", "greeting", "nl"),
    ("Guten Tag", "greeting", "de"),
    ("Grüß Gott", "greeting", "de"),
    ("Bonjour !", "greeting", "fr"),
    ("¡Hola!", "greeting", "es"),
    ("Buongiorno", "greeting", "it"),
    ("thanks!", "thanks", "en"),
    ("Thank you so much!!", "thanks", "en"),
    ("ok thanks", "thanks", "en"),
    ("Thanks for your help 🙏", "thanks", "en"),
    ("thank you", "thanks", "en"),
    ("dank je", "thanks", "nl"),
    ("Bedankt!", "thanks", "nl"),
    ("Oké, dank je wel", "thanks", "nl"),
    ("Top, bedankt voor de info", "thanks", "nl"),
    ("danke", "thanks", "de"),
    ("Vielen Dank für die Hilfe!", "thanks", "de"),
    ("merci", "thanks", "fr"),
    ("Merci beaucoup !", "thanks", "fr"),
    ("Muchas gracias", "thanks", "es"),
    ("grazie mille", "thanks", "it"),
    ("bye", "goodbye", "en"),
    ("Thanks, bye!", "goodbye", "en"),
    ("Dank je wel, fijne dag!", "goodbye", "nl"),
    ("Tot ziens", "goodbye", "nl"),
    ("Tschüss!", "goodbye", "de"),
    ("Au revoir", "goodbye", "fr"),
    ("Adiós", "goodbye", "es"),
    ("Arrivederci!", "goodbye", "it"),
]

NOT_SMALL_TALK = [
    "hi, what does shipping to Belgium cost?",
    "Hello, is anyone there?",
    "thanks, but where is my order?",
    "Thank you for the quick delivery of my boots",
    "thank you for nothing",
    "no thanks",
    "ok",
    "Bedankt, maar wat kost verzending naar Duitsland?",
    "Hallo, ik wil iets retourneren",
    "Danke, und wie lange dauert der Versand?",
    "hi " * 20,
    "Shipping to Belgium?",
    "",
]


def test_greetings_thanks_and_goodbyes_get_a_reply_in_their_language() -> None:
    for text, kind, language in SMALL_TALK:
        talk = small_talk(text)
        assert talk is not None, text
        assert talk.kind == kind, text
        # With nothing else known (no conversation, page or agent language) the words tell.
        assert talk.language([]) == language, text
        assert talk.reply(language) == phrase(f"smalltalk_{kind}", language)
    for text in NOT_SMALL_TALK:
        assert small_talk(text) is None, text


def test_words_of_several_languages_follow_the_conversation() -> None:
    hallo, thanks, merci = small_talk("Hallo"), small_talk("thanks"), small_talk("merci")
    assert hallo is not None
    assert thanks is not None
    assert merci is not None
    # "hallo" is Dutch or German: the conversation's (or page's, or agent's) decides
    assert hallo.language([None, "de", "nl"]) == "de"
    assert hallo.language(["fr", None, "nl-BE"]) == "nl"
    # English thanks in a Dutch conversation is answered in Dutch
    assert thanks.language(["nl", "en"]) == "nl"
    assert merci.language(["de"]) == "de"
    assert merci.language(["es"]) == "fr"
    # every reply exists, and differs, in every language
    for kind in ("greeting", "thanks", "goodbye"):
        replies = {phrase(f"smalltalk_{kind}", lang) for lang in LANGUAGES}
        assert len(replies) == len(LANGUAGES)
