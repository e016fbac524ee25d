"""The bot's own fixed sentences, in every language it answers in without a model."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# The languages every fixed sentence exists in; anything else is answered in English.
LANGUAGES = ("en", "nl", "de", "fr", "es", "it")

_Table = Mapping[str, Mapping[str, str]]

_PHRASES: _Table = MappingProxyType(
    {
        "unverified": {
            "en": "I couldn't verify this from the information on our website.",
            "nl": "Ik kon dit niet controleren aan de hand van de informatie op onze website.",
            "de": "Das konnte ich anhand der Informationen auf unserer Website nicht überprüfen.",
            "fr": "Je n'ai pas pu vérifier cela à partir des informations de notre site web.",
            "es": "No he podido comprobarlo con la información de nuestro sitio web.",
            "it": "Non sono riuscito a verificarlo con le informazioni del nostro sito web.",
        },
        "contact": {
            "en": "You can reach us at {route}.",
            "nl": "Je kunt ons bereiken via {route}.",
            "de": "Sie erreichen uns unter {route}.",
            "fr": "Vous pouvez nous contacter via {route}.",
            "es": "Puede contactarnos en {route}.",
            "it": "Può contattarci a {route}.",
        },
        # Said once, before quoting content written in another language.
        "only_in": {
            "en": "This information is only available in {other}:",
            "nl": "Deze informatie is alleen beschikbaar in het {other}:",
            "de": "Diese Information gibt es nur auf {other}:",
            "fr": "Cette information n'existe qu'en {other} :",
            "es": "Esta información solo está disponible en {other}:",
            "it": "Questa informazione è disponibile solo in {other}:",
        },
        "yes": {"en": "Yes.", "nl": "Ja.", "de": "Ja.", "fr": "Oui.", "es": "Sí.", "it": "Sì."},
        "no": {"en": "No.", "nl": "Nee.", "de": "Nein.", "fr": "Non.", "es": "No.", "it": "No."},
        # A yes/no question about something a complete list leaves out.
        "not_listed": {
            "en": "No, {thing} is not among them.",
            "nl": "Nee, {thing} hoort daar niet bij.",
            "de": "Nein, {thing} gehört nicht dazu.",
            "fr": "Non, {thing} n'en fait pas partie.",
            "es": "No, {thing} no está entre ellos.",
            "it": "No, {thing} non è tra questi.",
        },
        # Sent once when a messaging customer has waited too long because a service is down;
        # the answer follows when it is back.
        "holding": {
            "en": "We're having trouble answering right now; we'll reply here as soon as we can.",
            "nl": "We kunnen op dit moment even niet antwoorden; we reageren hier zo snel "
            "mogelijk.",
            "de": "Wir können gerade nicht antworten; wir melden uns hier, sobald wir können.",
            "fr": "Nous avons du mal à répondre pour le moment ; nous vous répondrons ici dès "
            "que possible.",
            "es": "Ahora mismo tenemos problemas para responder; le contestaremos aquí en cuanto "
            "podamos.",
            "it": "Al momento abbiamo difficoltà a rispondere; le risponderemo qui appena "
            "possibile.",
        },
        # A voice note, and no transcription model configured (or it could not be heard).
        "type_please": {
            "en": "Sorry, I can't listen to voice messages. Could you type your question?",
            "nl": "Sorry, ik kan geen spraakberichten beluisteren. Kun je je vraag typen?",
            "de": "Entschuldigung, ich kann keine Sprachnachrichten anhören. Kannst du deine "
            "Frage eintippen?",
            "fr": "Désolé, je ne peux pas écouter les messages vocaux. Pouvez-vous écrire votre "
            "question ?",
            "es": "Lo siento, no puedo escuchar mensajes de voz. ¿Puedes escribir tu pregunta?",
            "it": "Mi dispiace, non posso ascoltare i messaggi vocali. Puoi scrivere la tua "
            "domanda?",
        },
        # A picture or a file without a caption.
        "text_only": {
            "en": "Sorry, I can only read text. Could you type your question?",
            "nl": "Sorry, ik kan alleen tekst lezen. Kun je je vraag typen?",
            "de": "Entschuldigung, ich kann nur Text lesen. Kannst du deine Frage eintippen?",
            "fr": "Désolé, je ne peux lire que du texte. Pouvez-vous écrire votre question ?",
            "es": "Lo siento, solo puedo leer texto. ¿Puedes escribir tu pregunta?",
            "it": "Mi dispiace, posso leggere solo testo. Puoi scrivere la tua domanda?",
        },
        # Asked once staff resolved a messaging conversation (`core.feedback`): with buttons
        # (Telegram), or answered in words (WhatsApp).
        "feedback_question": {
            "en": "Did this answer your question?",
            "nl": "Heeft dit je vraag beantwoord?",
            "de": "Hat das deine Frage beantwortet?",
            "fr": "Cela a-t-il répondu à votre question ?",
            "es": "¿Ha respondido esto a tu pregunta?",
            "it": "Questo ha risposto alla tua domanda?",
        },
        "feedback_question_reply": {
            "en": "Did this answer your question? Reply 1 for yes, 2 for no.",
            "nl": "Heeft dit je vraag beantwoord? Antwoord 1 voor ja, 2 voor nee.",
            "de": "Hat das deine Frage beantwortet? Antworte 1 für ja, 2 für nein.",
            "fr": "Cela a-t-il répondu à votre question ? Répondez 1 pour oui, 2 pour non.",
            "es": "¿Ha respondido esto a tu pregunta? Responde 1 para sí, 2 para no.",
            "it": "Questo ha risposto alla tua domanda? Rispondi 1 per sì, 2 per no.",
        },
        "feedback_yes": {
            "en": "👍 Yes",
            "nl": "👍 Ja",
            "de": "👍 Ja",
            "fr": "👍 Oui",
            "es": "👍 Sí",
            "it": "👍 Sì",
        },
        "feedback_no": {
            "en": "👎 No",
            "nl": "👎 Nee",
            "de": "👎 Nein",
            "fr": "👎 Non",
            "es": "👎 No",
            "it": "👎 No",
        },
        # The replies to a message that is nothing but a greeting, thanks or goodbye
        # (`core.answer.smalltalk`); as formal as "contact", which may follow them.
        "smalltalk_greeting": {
            "en": "Hello! How can I help you?",
            "nl": "Hallo! Waarmee kan ik je helpen?",
            "de": "Hallo! Wie kann ich Ihnen helfen?",
            "fr": "Bonjour ! Comment puis-je vous aider ?",
            "es": "¡Hola! ¿En qué puedo ayudarle?",
            "it": "Buongiorno! Come posso aiutarLa?",
        },
        "smalltalk_thanks": {
            "en": "You're welcome! Is there anything else I can help you with?",
            "nl": "Graag gedaan! Kan ik je nog ergens anders mee helpen?",
            "de": "Gern geschehen! Kann ich Ihnen noch bei etwas anderem helfen?",
            "fr": "Avec plaisir ! Puis-je vous aider pour autre chose ?",
            "es": "¡De nada! ¿Puedo ayudarle en algo más?",
            "it": "Prego! Posso aiutarLa in qualcos'altro?",
        },
        "smalltalk_goodbye": {
            "en": "Goodbye, and have a nice day!",
            "nl": "Tot ziens, en nog een fijne dag!",
            "de": "Auf Wiedersehen und einen schönen Tag noch!",
            "fr": "Au revoir, et bonne journée !",
            "es": "¡Adiós, y que tenga un buen día!",
            "it": "Arrivederci, e buona giornata!",
        },
        # A quota has run out (`core.answer.quotas`): the visitor's for today, or the agent's
        # for this month.
        "quota_visitor_day": {
            "en": "You have reached today's limit of questions. Please come back tomorrow.",
            "nl": "Je hebt het maximale aantal vragen voor vandaag bereikt. Kom morgen gerust "
            "terug.",
            "de": "Sie haben die Höchstzahl an Fragen für heute erreicht. Kommen Sie gern morgen "
            "wieder.",
            "fr": "Vous avez atteint le nombre maximal de questions pour aujourd'hui. Revenez "
            "demain.",
            "es": "Ha alcanzado el límite de preguntas de hoy. Vuelva mañana, por favor.",
            "it": "Ha raggiunto il limite di domande per oggi. Torni domani, per favore.",
        },
        "quota_agent_month": {
            "en": "Sorry, I can't answer any more questions this month.",
            "nl": "Sorry, ik kan deze maand geen vragen meer beantwoorden.",
            "de": "Entschuldigung, ich kann diesen Monat keine Fragen mehr beantworten.",
            "fr": "Désolé, je ne peux plus répondre à des questions ce mois-ci.",
            "es": "Lo siento, este mes ya no puedo responder más preguntas.",
            "it": "Mi dispiace, questo mese non posso rispondere ad altre domande.",
        },
        "feedback_thanks": {
            "en": "Thanks for your feedback!",
            "nl": "Bedankt voor je feedback!",
            "de": "Danke für dein Feedback!",
            "fr": "Merci pour votre retour !",
            "es": "¡Gracias por tu opinión!",
            "it": "Grazie per il tuo feedback!",
        },
    }
)

# Language names as each language writes them: LANGUAGE_NAMES[reply][content].
LANGUAGE_NAMES: _Table = MappingProxyType(
    {
        "en": {"en": "English", "nl": "Dutch", "de": "German", "fr": "French",
               "es": "Spanish", "it": "Italian", "pt": "Portuguese", "da": "Danish",
               "sv": "Swedish", "pl": "Polish"},
        "nl": {"en": "Engels", "nl": "Nederlands", "de": "Duits", "fr": "Frans",
               "es": "Spaans", "it": "Italiaans"},
        "de": {"en": "Englisch", "nl": "Niederländisch", "de": "Deutsch", "fr": "Französisch",
               "es": "Spanisch", "it": "Italienisch"},
        "fr": {"en": "anglais", "nl": "néerlandais", "de": "allemand", "fr": "français",
               "es": "espagnol", "it": "italien"},
        "es": {"en": "inglés", "nl": "neerlandés", "de": "alemán", "fr": "francés",
               "es": "español", "it": "italiano"},
        "it": {"en": "inglese", "nl": "olandese", "de": "tedesco", "fr": "francese",
               "es": "spagnolo", "it": "italiano"},
    }
)  # fmt: skip


def base_language(language: str | None) -> str:
    """ "nl-BE", "NL", "nl_be" -> "nl"; a language without fixed sentences -> "en"."""
    base = (language or "en").strip().lower().replace("_", "-").split("-")[0]
    return base if base in LANGUAGES else "en"


def phrase(name: str, language: str | None, **values: str) -> str:
    """The fixed sentence ``name`` in ``language`` (English when it has none)."""
    text = _PHRASES[name][base_language(language)]
    return text.format(**values) if values else text


def language_name(content: str, reply: str | None) -> str:
    """The name of language ``content`` in language ``reply``."""
    names = LANGUAGE_NAMES[base_language(reply)]
    return names.get(content.split("-")[0], content)


def deferral(language: str | None, contact_route: str) -> str:
    """ "I couldn't verify this ... You can reach us at ..." in ``language``."""
    text = phrase("unverified", language)
    route = contact_route.strip().rstrip(".")
    return f"{text} {phrase('contact', language, route=route)}" if route else text
