/*! Parley chat bubble. One file, no dependencies, no build step.
 *
 *   <script src="https://gateway.example/widget.js" data-agent="demo" data-key="pk_..." async></script>
 *
 * Optional: data-color="#0f766e" (brand colour, hex); data-include-tags="pricing,lang:nl"
 * and data-exclude-tags="internal" (only / never pages with these tags answer here). The API
 * base is derived from this script's own src. Everything lives in a shadow root, so the
 * page's CSS cannot reach it, and model or source text only ever enters the DOM as text
 * nodes (never innerHTML).
 */
(() => {
  "use strict";

  const VERSION = "1";
  const MAX_MESSAGE = 4000; // the gateway's limit (core.turns.MAX_MESSAGE_CHARS)
  const MAX_CONTEXT = 4000; // characters of page context sent with each question
  const IDLE_TIMEOUT_MS = 60000; // no byte from the stream for this long: give up
  const HISTORY_ITEMS = 40;

  const script =
    document.currentScript || document.querySelector('script[data-agent][src*="widget.js"]');
  if (!script) return;
  const agent = (script.getAttribute("data-agent") || "").trim();
  const key = (script.getAttribute("data-key") || "").trim();
  if (!agent) {
    console.warn("Parley widget: the script tag needs a data-agent attribute");
    return;
  }
  if (window.ParleyWidget && window.ParleyWidget.agent === agent) return; // included twice
  const BASE = new URL(".", script.src).href.replace(/\/+$/, "");
  const ENDPOINT = `${BASE}/api/v1/agents/${encodeURIComponent(agent)}/chat`;
  const EVENTS_ENDPOINT = `${BASE}/api/v1/agents/${encodeURIComponent(agent)}/conversations/events`;
  const RELISTEN_MS = [5000, 15000, 60000, 300000]; // after a stream is refused, wait this long
  const CLEAR_ENDPOINT = `${BASE}/api/v1/agents/${encodeURIComponent(agent)}/conversations/clear`;
  const FEEDBACK_ENDPOINT = `${BASE}/api/v1/agents/${encodeURIComponent(agent)}/feedback`;
  const COLOR = /^#[0-9a-f]{3}([0-9a-f]{3})?$/i.test(script.getAttribute("data-color") || "")
    ? script.getAttribute("data-color")
    : null;
  // data-include-tags="pricing,lang:nl" / data-exclude-tags: only (or never) pages with these
  // tags answer here, besides the agent's own filters. A tag the gateway would refuse is left
  // out (with a warning), so that one typo does not stop every question.
  const TAG = /^[\p{L}\p{N}_][\p{L}\p{N}_:/.-]{0,63}$/u;
  function tagsOf(name) {
    const tags = [];
    for (const raw of (script.getAttribute(name) || "").split(",")) {
      const tag = raw.trim().toLowerCase();
      if (!tag) continue;
      if (!TAG.test(tag)) console.warn(`Parley widget: ${name}: "${raw.trim()}" is not a tag`);
      else if (!tags.includes(tag) && tags.length < 32) tags.push(tag);
    }
    return tags;
  }
  const FILTERS = { include_tags: tagsOf("data-include-tags"), exclude_tags: tagsOf("data-exclude-tags") };
  const HAS_FILTERS = FILTERS.include_tags.length > 0 || FILTERS.exclude_tags.length > 0;

  // ---------------------------------------------------------------- UI strings

  const STRINGS = {
    en: {
      title: "Ask a question",
      greeting: "Hi! How can we help you today?",
      placeholder: "Type your question…",
      send: "Send",
      newConversation: "New conversation",
      open: "Open chat",
      close: "Close chat",
      searching: "Searching…",
      reading: "Reading…",
      readingPage: "Reading {page}…",
      answering: "Answering…",
      sources: "Sources",
      source: "Source",
      related: "Related reading",
      you: "You",
      assistant: "Assistant",
      retry: "Try again",
      rateLimited: "You're sending messages quickly. Please wait a moment and try again.",
      forbidden: "The chat isn't available on this page.",
      invalid: "That message couldn't be sent. Please shorten it and try again.",
      server: "Something went wrong on our side. Please try again in a moment.",
      network: "We couldn't reach the assistant. Check your connection and try again.",
      failed: "Sorry, I couldn't write an answer just now. Please try again.",
      team: "Support team",
      withTeam: "Chatting with our team",
      typing: "{name} is typing…",
      joined: "A person from our team has joined the conversation.",
      left: "You're chatting with the assistant again.",
      waiting: "A person will reply here as soon as possible.",
      unread: "New message",
      rate: "Was this answer helpful?",
      helpful: "Helpful",
      notHelpful: "Not helpful",
      commentLabel: "What was missing? (optional)",
      sendComment: "Send",
      thanks: "Thanks for your feedback!",
      feedbackFailed: "Your feedback couldn't be sent. Please try again.",
    },
    nl: {
      title: "Stel een vraag",
      greeting: "Hallo! Waarmee kunnen we je helpen?",
      placeholder: "Typ je vraag…",
      send: "Versturen",
      newConversation: "Nieuw gesprek",
      open: "Chat openen",
      close: "Chat sluiten",
      searching: "Zoeken…",
      reading: "Lezen…",
      readingPage: "{page} lezen…",
      answering: "Antwoorden…",
      sources: "Bronnen",
      source: "Bron",
      related: "Lees ook",
      you: "Jij",
      assistant: "Assistent",
      retry: "Opnieuw proberen",
      rateLimited: "Je stuurt snel achter elkaar berichten. Wacht even en probeer het opnieuw.",
      forbidden: "De chat is op deze pagina niet beschikbaar.",
      invalid: "Dit bericht kon niet worden verstuurd. Maak het korter en probeer het opnieuw.",
      server: "Er ging bij ons iets mis. Probeer het zo nog eens.",
      network: "We konden de assistent niet bereiken. Controleer je verbinding en probeer het opnieuw.",
      failed: "Sorry, het lukte nu niet om een antwoord te geven. Probeer het nog eens.",
      team: "Klantenservice",
      withTeam: "In gesprek met ons team",
      typing: "{name} typt…",
      joined: "Een medewerker van ons team neemt nu deel aan het gesprek.",
      left: "Je chat weer met de assistent.",
      waiting: "Een medewerker reageert hier zo snel mogelijk.",
      unread: "Nieuw bericht",
      rate: "Was dit antwoord nuttig?",
      helpful: "Nuttig",
      notHelpful: "Niet nuttig",
      commentLabel: "Wat ontbrak er? (optioneel)",
      sendComment: "Versturen",
      thanks: "Bedankt voor je feedback!",
      feedbackFailed: "Je feedback kon niet worden verstuurd. Probeer het opnieuw.",
    },
    de: {
      title: "Stellen Sie eine Frage",
      greeting: "Hallo! Wie können wir Ihnen helfen?",
      placeholder: "Ihre Frage…",
      send: "Senden",
      newConversation: "Neues Gespräch",
      open: "Chat öffnen",
      close: "Chat schließen",
      searching: "Suche…",
      reading: "Lese…",
      readingPage: "Lese {page}…",
      answering: "Antworte…",
      sources: "Quellen",
      source: "Quelle",
      related: "Weiterlesen",
      you: "Sie",
      assistant: "Assistent",
      retry: "Erneut versuchen",
      rateLimited:
        "Sie senden sehr schnell Nachrichten. Bitte warten Sie einen Moment und versuchen Sie es erneut.",
      forbidden: "Der Chat ist auf dieser Seite nicht verfügbar.",
      invalid: "Diese Nachricht konnte nicht gesendet werden. Bitte kürzen Sie sie.",
      server: "Bei uns ist etwas schiefgelaufen. Bitte versuchen Sie es gleich noch einmal.",
      network:
        "Der Assistent ist nicht erreichbar. Prüfen Sie Ihre Verbindung und versuchen Sie es erneut.",
      failed:
        "Entschuldigung, ich konnte gerade keine Antwort geben. Bitte versuchen Sie es noch einmal.",
      team: "Kundenservice",
      withTeam: "Im Gespräch mit unserem Team",
      typing: "{name} schreibt…",
      joined: "Ein Mensch aus unserem Team ist dem Gespräch beigetreten.",
      left: "Sie chatten wieder mit dem Assistenten.",
      waiting: "Ein Mensch aus unserem Team antwortet Ihnen hier so bald wie möglich.",
      unread: "Neue Nachricht",
      rate: "War diese Antwort hilfreich?",
      helpful: "Hilfreich",
      notHelpful: "Nicht hilfreich",
      commentLabel: "Was hat gefehlt? (optional)",
      sendComment: "Senden",
      thanks: "Danke für Ihr Feedback!",
      feedbackFailed: "Ihr Feedback konnte nicht gesendet werden. Bitte versuchen Sie es erneut.",
    },
    fr: {
      title: "Posez une question",
      greeting: "Bonjour ! Comment pouvons-nous vous aider ?",
      placeholder: "Écrivez votre question…",
      send: "Envoyer",
      newConversation: "Nouvelle conversation",
      open: "Ouvrir le chat",
      close: "Fermer le chat",
      searching: "Recherche…",
      reading: "Lecture…",
      readingPage: "Lecture de {page}…",
      answering: "Rédaction…",
      sources: "Sources",
      source: "Source",
      related: "À lire aussi",
      you: "Vous",
      assistant: "Assistant",
      retry: "Réessayer",
      rateLimited: "Vous envoyez des messages trop rapidement. Patientez un instant puis réessayez.",
      forbidden: "Le chat n'est pas disponible sur cette page.",
      invalid: "Ce message n'a pas pu être envoyé. Raccourcissez-le et réessayez.",
      server: "Un problème est survenu de notre côté. Veuillez réessayer dans un instant.",
      network: "Impossible de joindre l'assistant. Vérifiez votre connexion et réessayez.",
      failed: "Désolé, je n'ai pas pu répondre pour le moment. Veuillez réessayer.",
      team: "Service client",
      withTeam: "En conversation avec notre équipe",
      typing: "{name} est en train d'écrire…",
      joined: "Une personne de notre équipe a rejoint la conversation.",
      left: "Vous discutez de nouveau avec l'assistant.",
      waiting: "Une personne vous répondra ici dès que possible.",
      unread: "Nouveau message",
      rate: "Cette réponse vous a-t-elle aidé ?",
      helpful: "Utile",
      notHelpful: "Pas utile",
      commentLabel: "Qu'est-ce qui manquait ? (facultatif)",
      sendComment: "Envoyer",
      thanks: "Merci pour votre avis !",
      feedbackFailed: "Votre avis n'a pas pu être envoyé. Veuillez réessayer.",
    },
  };
  const rawLang = (document.documentElement.getAttribute("lang") || "").trim();
  const pageLanguage = /^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})?$/.test(rawLang)
    ? rawLang.split(/[-_]/)[0].toLowerCase()
    : null;
  const T = STRINGS[pageLanguage] || STRINGS.en;
  const uiLanguage = STRINGS[pageLanguage] ? pageLanguage : "en";

  // ---------------------------------------------------------------- storage and ids

  const storage = {
    get(name) {
      try {
        return window.localStorage.getItem(name);
      } catch (_) {
        return null; // storage blocked (privacy mode, sandboxed frame)
      }
    },
    set(name, value) {
      try {
        window.localStorage.setItem(name, value);
      } catch (_) {
        /* full or blocked: the chat still works for this page view */
      }
    },
    remove(name) {
      try {
        window.localStorage.removeItem(name);
      } catch (_) {
        /* blocked */
      }
    },
  };
  const SESSION_KEY = `parley:${agent}:session`;
  const HISTORY_KEY = `parley:${agent}:history`;

  function newSessionId() {
    // crypto.randomUUID needs a secure context; getRandomValues works everywhere.
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const hex = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  }

  let sessionId = storage.get(SESSION_KEY);
  if (!sessionId || !/^[A-Za-z0-9_-]{8,100}$/.test(sessionId)) {
    sessionId = newSessionId();
    storage.set(SESSION_KEY, sessionId);
  }

  // ---------------------------------------------------------------- SSE parser

  /** A Server-Sent Events parser (WHATWG HTML "event stream interpretation").
   * feed() takes decoded text in chunks split anywhere, including between CR and LF;
   * onEvent({event, data, id}) is called once per complete event. */
  function createSseParser(onEvent) {
    let buffer = "";
    let skipLF = false; // the last chunk ended with CR: a leading LF belongs to it
    let data = [];
    let type = "";
    let lastId = "";

    function line(text) {
      if (text === "") {
        if (data.length) onEvent({ event: type || "message", data: data.join("\n"), id: lastId });
        data = [];
        type = "";
        return;
      }
      if (text.charCodeAt(0) === 58) return; // ":" comment (keep-alive)
      const colon = text.indexOf(":");
      const field = colon < 0 ? text : text.slice(0, colon);
      let value = colon < 0 ? "" : text.slice(colon + 1);
      if (value.charCodeAt(0) === 32) value = value.slice(1);
      if (field === "event") type = value;
      else if (field === "data") data.push(value);
      else if (field === "id" && value.indexOf("\0") < 0) lastId = value;
      // "retry" and unknown fields are ignored
    }

    return {
      feed(chunk) {
        if (!chunk) return;
        if (skipLF && chunk.charCodeAt(0) === 10) chunk = chunk.slice(1);
        skipLF = false;
        buffer += chunk;
        let start = 0;
        for (let i = 0; i < buffer.length; i++) {
          const c = buffer.charCodeAt(i);
          if (c !== 10 && c !== 13) continue;
          line(buffer.slice(start, i));
          if (c === 13) {
            if (i + 1 === buffer.length) skipLF = true;
            else if (buffer.charCodeAt(i + 1) === 10) i++;
          }
          start = i + 1;
        }
        buffer = buffer.slice(start);
      },
      // At end of stream an unterminated event is discarded, as the standard says.
      end() {
        buffer = "";
        data = [];
        type = "";
      },
    };
  }

  // ---------------------------------------------------------------- DOM helpers

  function h(tag, attrs, children) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const name of Object.keys(attrs)) {
        const value = attrs[name];
        if (value === null || value === undefined || value === false) continue;
        if (name === "text") el.textContent = value;
        else if (name === "class") el.className = value;
        else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
        else el.setAttribute(name, value === true ? "" : String(value));
      }
    }
    if (children !== undefined && children !== null) {
      for (const child of [].concat(children)) {
        if (child !== null && child !== undefined) el.append(child); // strings become text nodes
      }
    }
    return el;
  }

  const SVG_NS = "http://www.w3.org/2000/svg";
  const ICONS = {
    chat: ["M21 12a8 8 0 0 1-11.6 7.1L4 20.5l1.4-4.9A8 8 0 1 1 21 12z"],
    close: ["M6 6l12 12", "M18 6L6 18"],
    compose: ["M12 20h9", "M16.5 3.5a2.12 2.12 0 0 1 3 3L7 19l-4 1 1-4z"],
    send: ["M22 2L11 13", "M22 2l-7 20-4-9-9-4z"],
    up: ["M7 10v12", "M15 5.88L14 10h5.83a2 2 0 0 1 1.92 2.56l-2.33 8A2 2 0 0 1 17.5 22H4a2 2 0 0 1-2-2v-8a2 2 0 0 1 2-2h2.76a2 2 0 0 0 1.79-1.11L12 2a3.13 3.13 0 0 1 3 3.88z"],
    down: ["M17 14V2", "M9 18.12L10 14H4.17a2 2 0 0 1-1.92-2.56l2.33-8A2 2 0 0 1 6.5 2H20a2 2 0 0 1 2 2v8a2 2 0 0 1-2 2h-2.76a2 2 0 0 0-1.79 1.11L12 22a3.13 3.13 0 0 1-3-3.88z"],
  };
  function icon(name) {
    const svg = document.createElementNS(SVG_NS, "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("fill", "none");
    svg.setAttribute("stroke", "currentColor");
    svg.setAttribute("stroke-width", "2");
    svg.setAttribute("stroke-linecap", "round");
    svg.setAttribute("stroke-linejoin", "round");
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    for (const d of ICONS[name]) {
      const path = document.createElementNS(SVG_NS, "path");
      path.setAttribute("d", d);
      svg.append(path);
    }
    return svg;
  }

  /** An href that is safe to follow: http(s) absolute or root-relative, else null. */
  function safeUrl(value) {
    if (typeof value !== "string") return null;
    const url = value.trim();
    if (!url || /[\u0000-\u001f\u007f]/.test(url)) return null;
    if (url[0] === "/") return url[1] === "/" || url[1] === "\\" ? null : url;
    try {
      const parsed = new URL(url);
      return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
    } catch (_) {
      return null;
    }
  }

  function externalLink(href, children, attrs) {
    return h("a", Object.assign({ href, target: "_blank", rel: "noopener" }, attrs || {}), children);
  }

  // ---------------------------------------------------------------- safe Markdown

  const ESCAPABLE = "\\`*_{}[]()#+-.!>|~";
  const RE = {
    code: /(`+)([\s\S]*?[^`])\1(?!`)/y,
    strong: /\*\*(?=\S)([\s\S]*?\S)\*\*/y,
    strongU: /__(?=\S)([\s\S]*?\S)__(?![A-Za-z0-9])/y,
    em: /\*(?=[^\s*])([^*]*?[^\s*])?\*(?!\*)/y,
    emU: /_(?=[^\s_])([^_]*?[^\s_])?_(?![A-Za-z0-9])/y,
    link: /\[([^\[\]\n]+)\]\(\s*<?([^\s<>()]+(?:\([^\s<>()]*\)[^\s<>()]*)*)>?(?:\s+"[^"\n]*")?\s*\)/y,
    cite: /\[(\d{1,3}(?:\s*[,;]\s*\d{1,3})*)\]/y,
    url: /https?:\/\/[^\s<>"'`]+/iy,
  };
  const isWordChar = (c) => !!c && /[\p{L}\p{N}_]/u.test(c);

  function at(re, text, i) {
    re.lastIndex = i;
    return re.exec(text);
  }

  /** Appends the inline Markdown of `text` to `parent` as elements and text nodes. */
  function inline(parent, text, ctx, depth, inLink) {
    let pending = "";
    const flush = () => {
      if (pending) parent.append(pending);
      pending = "";
    };
    let i = 0;
    while (i < text.length) {
      const c = text[i];
      const prev = text[i - 1];
      let m = null;
      if (c === "\\" && ESCAPABLE.includes(text[i + 1] || "\n")) {
        pending += text[i + 1];
        i += 2;
        continue;
      }
      if (c === "`" && (m = at(RE.code, text, i))) {
        flush();
        let code = m[2];
        if (/^ .*\S.* $/.test(code)) code = code.slice(1, -1);
        parent.append(h("code", { text: code }));
        i += m[0].length;
        continue;
      }
      if (depth < 4) {
        if (c === "*" && text[i + 1] === "*" && (m = at(RE.strong, text, i))) {
          flush();
          const el = h("strong");
          inline(el, m[1], ctx, depth + 1, inLink);
          parent.append(el);
          i += m[0].length;
          continue;
        }
        if (c === "_" && text[i + 1] === "_" && !isWordChar(prev) && (m = at(RE.strongU, text, i))) {
          flush();
          const el = h("strong");
          inline(el, m[1], ctx, depth + 1, inLink);
          parent.append(el);
          i += m[0].length;
          continue;
        }
        if (c === "*" && (m = at(RE.em, text, i))) {
          flush();
          const el = h("em");
          inline(el, m[0].slice(1, -1), ctx, depth + 1, inLink);
          parent.append(el);
          i += m[0].length;
          continue;
        }
        if (c === "_" && !isWordChar(prev) && (m = at(RE.emU, text, i))) {
          flush();
          const el = h("em");
          inline(el, m[0].slice(1, -1), ctx, depth + 1, inLink);
          parent.append(el);
          i += m[0].length;
          continue;
        }
        if (c === "[" && !inLink && (m = at(RE.link, text, i))) {
          flush();
          const href = safeUrl(m[2]);
          if (href) {
            const a = externalLink(href);
            inline(a, m[1], ctx, depth + 1, true);
            parent.append(a);
          } else {
            inline(parent, m[1], ctx, depth + 1, inLink); // unsafe target: keep the words only
          }
          i += m[0].length;
          continue;
        }
      }
      if (c === "[" && (m = at(RE.cite, text, i))) {
        flush();
        for (const n of m[1].split(/\s*[,;]\s*/)) parent.append(ctx.cite(Number(n), inLink));
        i += m[0].length;
        continue;
      }
      if ((c === "h" || c === "H") && !inLink && !isWordChar(prev) && (m = at(RE.url, text, i))) {
        let url = m[0];
        // Sentence punctuation after a bare URL is not part of it; nor is an unmatched ")".
        const count = (ch) => url.split(ch).length - 1;
        while (/[.,;:!?'")\]*_]$/.test(url)) {
          if (url.endsWith(")") && count("(") >= count(")")) break; // a balanced (…) is part of it
          url = url.slice(0, -1);
        }
        const href = safeUrl(url);
        if (href) {
          flush();
          parent.append(externalLink(href, url));
          i += url.length;
          continue;
        }
      }
      pending += c;
      i++;
    }
    flush();
  }

  /** Markdown as a DocumentFragment: paragraphs, lists, code, emphasis, links, citations. */
  function renderMarkdown(text, ctx) {
    const frag = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    let para = null;
    let list = null; // {el, ordered}
    let item = null;
    let blank = false;

    const flushPara = () => {
      if (!para) return;
      const p = h("p");
      para.forEach((l, j) => {
        if (j) p.append(h("br"));
        inline(p, l, ctx, 0, false);
      });
      frag.append(p);
      para = null;
    };
    const closeList = () => {
      list = null;
      item = null;
    };

    for (let n = 0; n < lines.length; n++) {
      const raw = lines[n];
      let m;
      if ((m = /^\s{0,3}(`{3,}|~{3,})/.exec(raw))) {
        flushPara();
        closeList();
        const fence = m[1];
        const body = [];
        n++;
        while (n < lines.length && !lines[n].trim().startsWith(fence)) body.push(lines[n++]);
        frag.append(h("pre", null, h("code", { text: body.join("\n") })));
        blank = false;
        continue;
      }
      if (!raw.trim()) {
        flushPara();
        blank = true;
        continue;
      }
      const bullet = /^\s*[-*+•]\s+(.*)$/.exec(raw);
      const numbered = bullet ? null : /^\s*(\d{1,9})[.)]\s+(.*)$/.exec(raw);
      if (bullet || numbered) {
        flushPara();
        const ordered = !!numbered;
        if (!list || list.ordered !== ordered) {
          const el = h(ordered ? "ol" : "ul");
          if (ordered && numbered[1] !== "1") el.setAttribute("start", String(Number(numbered[1])));
          frag.append(el);
          list = { el, ordered };
        }
        item = h("li");
        inline(item, (bullet || numbered)[bullet ? 1 : 2], ctx, 0, false);
        list.el.append(item);
        blank = false;
        continue;
      }
      if ((m = /^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$/.exec(raw))) {
        flushPara();
        closeList();
        const p = h("p", { class: "heading" });
        const strong = h("strong");
        inline(strong, m[1], ctx, 0, false);
        p.append(strong);
        frag.append(p);
        blank = false;
        continue;
      }
      if (item && (!blank || /^\s{2,}/.test(raw))) {
        item.append(h("br")); // a continuation line of the list item
        inline(item, raw.trim(), ctx, 0, false);
        blank = false;
        continue;
      }
      closeList();
      (para = para || []).push(raw.trim());
      blank = false;
    }
    flushPara();
    return frag;
  }

  // ---------------------------------------------------------------- page context

  const clean = (s) => String(s || "").replace(/\s+/g, " ").trim();
  const clip = (s, n) => (s.length > n ? `${s.slice(0, n - 1).trimEnd()}…` : s);
  let host = null; // the widget's own element, never part of the page context

  function isChrome(el) {
    // Site-wide furniture, not the page's content.
    const tag = el.tagName;
    if (tag === "NAV" || tag === "FOOTER" || tag === "ASIDE") return true;
    if (tag === "HEADER" && !el.parentElement.closest("main, article, [role=main]")) return true;
    const marker = `${el.id} ${typeof el.className === "string" ? el.className : ""}`;
    return /(^|[\s_-])(cookie|consent|gdpr|newsletter)/i.test(marker);
  }

  function isVisible(el) {
    if (el.hidden || el.getAttribute("aria-hidden") === "true") return false;
    if (typeof el.checkVisibility === "function") {
      return el.checkVisibility({ visibilityProperty: true, checkVisibilityCSS: true });
    }
    return el.getClientRects().length > 0;
  }

  const SKIP = new Set([
    "SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "SVG", "CANVAS", "IFRAME", "OBJECT", "VIDEO",
    "AUDIO", "FORM", "BUTTON", "SELECT", "TEXTAREA", "INPUT",
  ]);
  const BLOCK = new RegExp(
    "^(P|DIV|LI|UL|OL|DL|DT|DD|H[1-6]|TR|TABLE|SECTION|ARTICLE|MAIN|HEADER|BLOCKQUOTE|PRE" +
      "|FIGURE|FIGCAPTION|BR|HR|ADDRESS|DETAILS|SUMMARY)$",
  );

  function visibleText(root, limit) {
    let out = "";
    (function walk(node) {
      for (let c = node.firstChild; c && out.length < limit; c = c.nextSibling) {
        if (c.nodeType === 3) {
          out += c.nodeValue.replace(/\s+/g, " ");
        } else if (c.nodeType === 1) {
          const tag = c.tagName.toUpperCase();
          if (SKIP.has(tag) || c === host || isChrome(c) || !isVisible(c)) continue;
          const block = BLOCK.test(tag);
          if (block) out += "\n";
          else if (tag === "TD" || tag === "TH") out += " ";
          walk(c);
          if (block) out += "\n";
        }
      }
    })(root);
    return out
      .replace(/ *\n[\s]*/g, "\n")
      .trim()
      .slice(0, limit);
  }

  const LD_FIELDS = [
    "@type", "name", "sku", "mpn", "gtin13", "gtin", "model", "color", "size", "material",
    "category", "price", "lowPrice", "highPrice", "priceCurrency", "availability",
    "itemCondition", "priceValidUntil", "ratingValue", "reviewCount", "telephone",
    "openingHours", "streetAddress", "addressLocality", "postalCode", "addressCountry",
  ];
  const LD_NESTED = {
    "@graph": "", offers: "", hasVariant: "", mainEntity: "", itemListElement: "", item: "",
    brand: "brand ", aggregateRating: "rating ", address: "address ",
  };

  function structuredFacts(node, out, depth, prefix) {
    if (!node || depth > 6 || out.length > 60) return;
    if (Array.isArray(node)) {
      for (const n of node.slice(0, 20)) structuredFacts(n, out, depth + 1, prefix);
      return;
    }
    if (typeof node !== "object") return;
    for (const field of LD_FIELDS) {
      let v = node[field];
      if (Array.isArray(v) && v.every((x) => typeof x === "string")) v = v.join(", ");
      if (typeof v !== "string" && typeof v !== "number") continue;
      v = clip(clean(String(v).replace(/^https?:\/\/schema\.org\//i, "")), 120);
      if (v) out.push(`${prefix}${field.replace("@", "")}: ${v}`);
    }
    for (const field of Object.keys(LD_NESTED)) {
      if (node[field] && typeof node[field] === "object") {
        structuredFacts(node[field], out, depth + 1, prefix + LD_NESTED[field]);
      }
    }
  }

  function pageContext() {
    const parts = [];
    let room = MAX_CONTEXT;
    const add = (label, value, cap) => {
      const space = Math.min(cap, room - label.length - 3);
      if (space < 8) return;
      const text = clip(clean(value), space);
      if (!text) return;
      const part = `${label}: ${text}`;
      parts.push(part);
      room -= part.length + 1;
    };
    const meta = (selector) => {
      const el = document.querySelector(selector);
      return el ? el.getAttribute("content") || "" : "";
    };
    const title = clean(document.title);
    const description = clean(meta('meta[name="description" i]'));
    add("Title", title, 300);
    add("Description", description, 500);
    const seen = new Set([title, description]);
    const props = document.querySelectorAll('meta[property^="og:"], meta[property^="product:"]');
    for (const el of Array.from(props).slice(0, 16)) {
      const prop = el.getAttribute("property");
      const value = clean(el.getAttribute("content"));
      if (!value || seen.has(value) || /^og:(image|video|audio)/.test(prop)) continue;
      seen.add(value);
      add(prop, value, 300);
    }
    const facts = [];
    for (const el of document.querySelectorAll('script[type="application/ld+json"]')) {
      try {
        structuredFacts(JSON.parse(el.textContent), facts, 0, "");
      } catch (_) {
        /* malformed JSON-LD is common; skip it */
      }
    }
    add("Structured data", facts.join("; "), 1000);
    const root =
      document.querySelector("main, [role=main]") || document.querySelector("article") || document.body;
    if (root) {
      const headings = [];
      for (const el of root.querySelectorAll("h1, h2")) {
        if (el.closest("nav, footer, aside, parley-chat") || !isVisible(el)) continue;
        const hdr = el.closest("header");
        if (hdr && !hdr.closest("main, article, [role=main]")) continue;
        const text = clip(clean(el.textContent), 120);
        if (text) headings.push(text);
        if (headings.length >= 15) break;
      }
      add("Headings", headings.join(" | "), 600);
      add("Page text", visibleText(root, Math.max(0, room - 12)), room);
    }
    return parts.join("\n").slice(0, MAX_CONTEXT);
  }

  function pageInfo() {
    // Origin and path only: query strings and fragments can carry tokens or personal data.
    return {
      url: (location.origin + location.pathname).slice(0, 2048),
      title: clip(clean(document.title), 300) || null,
      context: pageContext() || null,
    };
  }

  // ---------------------------------------------------------------- styles

  const CSS = `
:host { all: initial; }
*, *::before, *::after { box-sizing: border-box; }
[hidden] { display: none !important; }
.root {
  --pc: ${COLOR || "#0f766e"}; --pc-text: #fff; --ink: #1f2933; --muted: #5f6b7a; --line: #e3e7ec;
  font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  font-size: 15px; line-height: 1.5; color: var(--ink); text-align: left; direction: ltr;
  -webkit-font-smoothing: antialiased; -webkit-text-size-adjust: 100%;
}
button { font: inherit; margin: 0; }
button:focus-visible, textarea:focus-visible, a:focus-visible { outline: 2px solid var(--pc); outline-offset: 2px; }
.launcher {
  position: fixed; right: 20px; bottom: 20px; width: 56px; height: 56px; padding: 0;
  display: flex; align-items: center; justify-content: center; cursor: pointer;
  border: 0; border-radius: 50%; background: var(--pc); color: var(--pc-text);
  box-shadow: 0 6px 18px rgba(15, 23, 42, .24), 0 2px 4px rgba(15, 23, 42, .12);
  transition: transform .15s ease, box-shadow .15s ease;
}
.launcher:hover { transform: translateY(-2px); box-shadow: 0 10px 24px rgba(15, 23, 42, .28); }
.launcher:focus-visible { outline-offset: 3px; }
.launcher svg { width: 26px; height: 26px; }
.panel {
  position: fixed; right: 20px; bottom: 88px; width: 380px; height: 600px;
  max-width: calc(100vw - 40px); max-height: calc(100vh - 108px);
  display: flex; flex-direction: column; overflow: hidden;
  background: #fff; border-radius: 16px;
  box-shadow: 0 16px 48px rgba(15, 23, 42, .22), 0 2px 8px rgba(15, 23, 42, .08);
  animation: pop .16s ease-out;
}
@keyframes pop { from { opacity: 0; transform: translateY(8px); } }
.header {
  display: flex; align-items: center; gap: 4px; padding: 12px 10px 12px 18px; flex: none;
  background: var(--pc); color: var(--pc-text);
}
.title { flex: 1; margin: 0; font-size: 16px; font-weight: 600; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.icon-btn {
  width: 36px; height: 36px; padding: 0; display: inline-flex; align-items: center; justify-content: center;
  border: 0; border-radius: 8px; background: transparent; color: inherit; cursor: pointer;
}
.icon-btn:hover { background: rgba(255, 255, 255, .16); }
.icon-btn:focus-visible { outline-color: #fff; outline-offset: -2px; }
.icon-btn svg { width: 20px; height: 20px; }
.log {
  flex: 1; min-height: 0; overflow-y: auto; overscroll-behavior: contain; overflow-anchor: none;
  display: flex; flex-direction: column; gap: 12px; padding: 18px 16px; background: #f6f7f9;
}
/* Flex items shrink to fit their column by default; in a scrolling log that squeezes long
   messages into one another. Each keeps the height of what it holds, and the log scrolls. */
.log > * { flex: none; }
/* relative: the screen-reader labels inside stay with their message when the log scrolls */
.msg { position: relative; max-width: 88%; padding: 10px 14px; border-radius: 16px; overflow-wrap: anywhere; }
.msg.user {
  align-self: flex-end; white-space: pre-wrap; border-bottom-right-radius: 4px;
  background: var(--pc); color: var(--pc-text);
}
.msg.bot {
  align-self: flex-start; min-width: 72px; border-bottom-left-radius: 4px;
  background: #fff; border: 1px solid var(--line); box-shadow: 0 1px 2px rgba(15, 23, 42, .04);
}
.msg.bot.error { background: #fff6f4; border-color: #f4cfc6; color: #8a2c1b; }
.status { display: flex; align-items: center; gap: 8px; min-height: 22px; color: var(--muted); font-size: 14px; }
.status-text { display: inline-flex; min-width: 0; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.status-page { min-width: 0; overflow: hidden; text-overflow: ellipsis; }
.dots { display: inline-flex; gap: 3px; }
.dots span { width: 6px; height: 6px; border-radius: 50%; background: currentColor; opacity: .35; animation: blink 1.2s infinite ease-in-out; }
.dots span:nth-child(2) { animation-delay: .15s; }
.dots span:nth-child(3) { animation-delay: .3s; }
@keyframes blink { 40% { opacity: 1; } }
.answer p { margin: 0 0 8px; }
.answer > :last-child { margin-bottom: 0; }
.answer ul, .answer ol { margin: 0 0 8px; padding-left: 22px; }
.answer li { margin: 2px 0; }
.answer code {
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px;
  background: #eef1f4; padding: 1px 5px; border-radius: 4px;
}
.answer pre { margin: 0 0 8px; padding: 8px 10px; background: #eef1f4; border-radius: 8px; overflow-x: auto; white-space: pre; }
.answer pre code { background: none; padding: 0; }
.answer a, .sources a { color: var(--pc); text-decoration: underline; text-underline-offset: 2px; }
.cite { font-size: 11px; line-height: 0; margin-left: 1px; }
.cite a, .cite span {
  display: inline-block; min-width: 16px; padding: 0 4px; border-radius: 8px; text-align: center;
  line-height: 16px; font-weight: 600; text-decoration: none; color: var(--pc);
  background: #eef1f4; background: color-mix(in srgb, var(--pc) 12%, #fff);
}
.sources { margin-top: 10px; padding-top: 8px; border-top: 1px solid var(--line); font-size: 13px; }
.sources-title { margin: 0 0 4px; color: var(--muted); font-size: 12px; font-weight: 600; letter-spacing: .02em; }
.sources ol { margin: 0; padding: 0; list-style: none; }
.sources li { display: flex; gap: 6px; align-items: baseline; margin: 3px 0; }
.sources li a { min-width: 0; } /* a long address or title wraps instead of widening the list */
.sources .n { flex: none; color: var(--muted); font-size: 12px; font-variant-numeric: tabular-nums; }
.related { margin-top: 10px; padding-top: 8px; border-top: 1px solid var(--line); }
.related-heading { margin: 0 0 6px; color: var(--muted); font-size: 12px; font-weight: 600; letter-spacing: .02em; }
.related ul { margin: 0; padding: 0; list-style: none; display: flex; flex-direction: column; gap: 6px; }
.related li { min-width: 0; }
.related-card {
  display: flex; flex-direction: column; gap: 1px; min-width: 0; padding: 7px 10px;
  border: 1px solid var(--line); border-radius: 10px; background: #f8fafc; text-decoration: none;
}
.related-card:hover { border-color: var(--pc); background: #fff; }
/* the title: two lines at most (the whole of it stays the link's name for screen readers) */
.related-card .card-title {
  display: -webkit-box; -webkit-box-orient: vertical; -webkit-line-clamp: 2; line-clamp: 2; overflow: hidden;
  color: var(--pc); font-size: 13px; font-weight: 600; line-height: 18px;
}
.related-card:hover .card-title { text-decoration: underline; text-underline-offset: 2px; }
/* where the link leads: one line, cut short with an ellipsis */
.related-card .card-where { overflow: hidden; color: var(--muted); font-size: 12px; line-height: 16px; white-space: nowrap; text-overflow: ellipsis; }
.retry {
  margin-top: 8px; padding: 4px 12px; border: 1px solid currentColor; border-radius: 999px;
  background: transparent; color: inherit; font-size: 13px; cursor: pointer;
}
.feedback { display: flex; flex-wrap: wrap; align-items: center; gap: 4px; margin-top: 8px; padding-top: 6px; border-top: 1px solid var(--line); }
.feedback-label { margin-right: auto; color: var(--muted); font-size: 12px; }
.thumb {
  width: 32px; height: 32px; padding: 0; display: inline-flex; align-items: center; justify-content: center;
  border: 1px solid transparent; border-radius: 8px; background: transparent; color: var(--muted); cursor: pointer;
}
.thumb:hover { background: #eef1f4; color: var(--ink); }
.thumb[aria-pressed="true"] { color: var(--pc); border-color: var(--pc); background: #eef1f4; background: color-mix(in srgb, var(--pc) 10%, #fff); }
.thumb svg { width: 18px; height: 18px; }
.feedback-form { flex-basis: 100%; display: flex; flex-direction: column; gap: 6px; margin-top: 4px; }
.feedback-form label { color: var(--muted); font-size: 12px; }
.feedback-form textarea {
  width: 100%; min-height: 56px; max-height: 120px; padding: 6px 10px; resize: vertical;
  font: inherit; font-size: 14px; line-height: 20px; color: var(--ink); background: #fff;
  border: 1px solid #cfd6de; border-radius: 8px;
}
.feedback-form button {
  align-self: flex-end; padding: 4px 14px; border: 0; border-radius: 999px;
  background: var(--pc); color: var(--pc-text); font-size: 13px; cursor: pointer;
}
.feedback-note { flex-basis: 100%; margin: 2px 0 0; color: var(--muted); font-size: 12px; }
.composer { display: flex; align-items: flex-end; gap: 8px; padding: 10px 12px 12px; flex: none; background: #fff; border-top: 1px solid var(--line); }
.input {
  flex: 1; min-width: 0; height: 42px; max-height: 128px; margin: 0; padding: 10px 14px; resize: none;
  font: inherit; line-height: 20px; color: var(--ink); background: #fff;
  border: 1px solid #cfd6de; border-radius: 12px; outline: none;
}
.input::placeholder { color: #8a94a3; }
.input:focus-visible { outline: none; } /* the border and glow below are its focus ring */
.input:focus { border-color: var(--pc); box-shadow: 0 0 0 3px rgba(15, 23, 42, .08); box-shadow: 0 0 0 3px color-mix(in srgb, var(--pc) 18%, transparent); }
.send {
  flex: none; width: 42px; height: 42px; padding: 0; display: inline-flex; align-items: center; justify-content: center;
  border: 0; border-radius: 12px; background: var(--pc); color: var(--pc-text); cursor: pointer;
}
.send:disabled { opacity: .4; cursor: default; }
.send svg { width: 20px; height: 20px; margin-left: -2px; }
.msg.staff {
  align-self: flex-start; white-space: pre-wrap; border-bottom-left-radius: 4px;
  background: #fff; border: 1px solid var(--line); border-left: 3px solid var(--pc);
}
.msg.staff .who { display: block; margin-bottom: 2px; color: var(--muted); font-size: 12px; font-weight: 600; white-space: normal; }
.staff-typing { margin: 0; padding: 2px 14px; color: var(--muted); font-size: 12px; font-style: italic; }
.staff-typing[hidden] { display: none; }
.note { align-self: center; max-width: 90%; margin: 0; color: var(--muted); font-size: 13px; text-align: center; }
.launcher.unread::after {
  content: ""; position: absolute; top: 2px; right: 2px; width: 12px; height: 12px;
  border-radius: 50%; background: #e11d48; box-shadow: 0 0 0 2px #fff;
}
.sr-only { position: absolute; width: 1px; height: 1px; margin: -1px; padding: 0; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; border: 0; }
@supports (height: 100dvh) { .panel { max-height: calc(100dvh - 108px); } }
/* A phone, or a window too low for the floating panel: the chat takes the whole screen. */
@media (max-width: 480px), (max-height: 480px) {
  .panel { top: 0; left: 0; right: 0; bottom: 0; width: 100%; height: 100%; max-width: none; max-height: none; border-radius: 0; }
  .root.open .launcher { display: none; }
  .launcher { right: 16px; bottom: 16px; }
  .msg { max-width: 92%; }
  .input { font-size: 16px; } /* below 16px iOS zooms the page on focus */
}
@media (prefers-reduced-motion: reduce) { *, *::before, *::after { animation: none !important; transition: none !important; } }
`;

  // ---------------------------------------------------------------- the widget

  function mount() {
    host = document.createElement("parley-chat");
    // Inline !important declarations outrank the page's stylesheets, even its !important
    // ones, so `* { display: none !important }` cannot hide or restyle the host.
    const hostStyle = {
      all: "initial",
      display: "block",
      position: "fixed",
      right: "0",
      bottom: "0",
      width: "0",
      height: "0",
      overflow: "visible",
      // The highest z-index there is: a shop's cookie banner, sticky header or chat-like
      // overlay must never cover the open panel.
      "z-index": "2147483647",
      visibility: "visible",
      opacity: "1",
      transform: "none",
      filter: "none",
      contain: "none",
    };
    for (const [prop, value] of Object.entries(hostStyle)) {
      host.style.setProperty(prop, value, "important");
    }
    host.setAttribute("data-parley-version", VERSION);
    const shadow = host.attachShadow({ mode: "open" });
    const style = document.createElement("style");
    style.textContent = CSS;
    shadow.append(style);

    const ids = { panel: "parley-panel", title: "parley-title" }; // unique: inside our shadow root
    const input = h("textarea", {
      class: "input",
      rows: 1,
      maxlength: MAX_MESSAGE,
      placeholder: T.placeholder,
      "aria-label": T.placeholder,
      enterkeyhint: "send",
    });
    const sendButton = h(
      "button",
      { type: "button", class: "send", "aria-label": T.send, title: T.send, disabled: true },
      icon("send"),
    );
    const log = h("div", {
      class: "log",
      role: "log",
      "aria-live": "polite",
      "aria-labelledby": ids.title,
    });
    const titleEl = h("h2", { class: "title", id: ids.title, text: T.title });
    const newButton = h(
      "button",
      { type: "button", class: "icon-btn new", "aria-label": T.newConversation, title: T.newConversation },
      icon("compose"),
    );
    const closeButton = h(
      "button",
      { type: "button", class: "icon-btn close", "aria-label": T.close, title: T.close },
      icon("close"),
    );
    const panel = h(
      "div",
      {
        class: "panel",
        id: ids.panel,
        role: "dialog",
        "aria-labelledby": ids.title,
        hidden: true,
        lang: uiLanguage,
      },
      [
        h("div", { class: "header" }, [
          titleEl,
          newButton,
          closeButton,
        ]),
        log,
        h("div", { class: "composer" }, [input, sendButton]),
      ],
    );
    const launcherIcon = h("span", { class: "launcher-icon" }, icon("chat"));
    const launcher = h(
      "button",
      {
        type: "button",
        class: "launcher",
        "aria-label": T.open,
        title: T.open,
        "aria-expanded": "false",
        "aria-controls": ids.panel,
      },
      launcherIcon,
    );
    const root = h("div", { class: "root" }, [panel, launcher]);
    shadow.append(root);
    (document.body || document.documentElement).append(host);

    let busy = false;
    let current = null; // {controller} of the request in flight

    // ------------------------------------------------------------ scrolling

    const atBottom = () => log.scrollHeight - log.scrollTop - log.clientHeight < 32;
    /** Runs `change`; follows the new content only if the visitor was reading the end. */
    function keepingScroll(change) {
      const follow = atBottom();
      change();
      if (follow) log.scrollTop = log.scrollHeight;
    }
    const scrollToEnd = () => {
      log.scrollTop = log.scrollHeight;
    };

    // ------------------------------------------------------------ history

    let history = [];
    function loadHistory() {
      try {
        const saved = JSON.parse(storage.get(HISTORY_KEY) || "null");
        if (saved && saved.session === sessionId && Array.isArray(saved.items)) return saved.items;
      } catch (_) {
        /* unreadable: start empty */
      }
      return [];
    }
    function saveHistory() {
      history = history.slice(-HISTORY_ITEMS);
      let json = JSON.stringify({ session: sessionId, items: history });
      while (json.length > 200000 && history.length > 2) {
        history = history.slice(2);
        json = JSON.stringify({ session: sessionId, items: history });
      }
      storage.set(HISTORY_KEY, json);
    }

    // ------------------------------------------------------------ messages

    function greeting() {
      const text = h("div", { class: "answer" }, h("p", { text: T.greeting }));
      return h("div", { class: "msg bot greeting" }, text);
    }

    function addUser(text) {
      const label = h("span", { class: "sr-only", text: `${T.you}: ` });
      const el = h("div", { class: "msg user" }, [label, text]);
      log.append(el);
      return el;
    }

    // "<staff> is typing…" below the log while staff write in the console; it goes
    // when their message arrives, or a few seconds after they stop.
    const staffTyping = h("p", { class: "staff-typing", "aria-live": "polite", hidden: true });
    log.after(staffTyping);
    let staffTypingTimer = 0;
    function showStaffTyping(name) {
      staffTyping.textContent = T.typing.replace("{name}", () => name);
      // It takes its line from the log: a log read to its end stays at its end.
      keepingScroll(() => {
        staffTyping.hidden = false;
      });
      clearTimeout(staffTypingTimer);
      staffTypingTimer = setTimeout(hideStaffTyping, 7000);
    }
    function hideStaffTyping() {
      clearTimeout(staffTypingTimer);
      staffTyping.hidden = true;
    }

    /** A message from a person on the shop's side: plain text, labelled as the team's. */
    function addStaff(text) {
      hideStaffTyping();
      const el = h("div", { class: "msg staff" }, [
        h("span", { class: "who", text: T.team }),
        h("span", { class: "sr-only", text: ": " }),
        text,
      ]);
      keepingScroll(() => log.append(el));
      return el;
    }

    const NOTES = { joined: () => T.joined, left: () => T.left, waiting: () => T.waiting };

    /** A line about the conversation itself ("a person has joined"), not from anyone. */
    function addNote(name) {
      const el = h("p", { class: "note", "data-note": name, text: NOTES[name]() });
      keepingScroll(() => log.append(el));
      return el;
    }

    /** A bot message: status while waiting, then the streamed answer, then its sources. */
    function addBot() {
      const statusText = h("span", { class: "status-text" });
      const status = h("div", { class: "status" }, [
        h("span", { class: "dots", "aria-hidden": "true" }, [h("span"), h("span"), h("span")]),
        statusText,
      ]);
      const answer = h("div", { class: "answer" });
      const sourcesBox = h("div", { class: "sources", hidden: true });
      const relatedBox = h("div", { class: "related", hidden: true });
      const el = h("div", { class: "msg bot", "data-state": "waiting" }, [
        h("span", { class: "sr-only", text: `${T.assistant}: ` }),
        status,
        answer,
        sourcesBox,
        relatedBox,
      ]);
      log.append(el);
      return {
        el,
        status,
        statusText,
        answer,
        sourcesBox,
        relatedBox,
        question: "",
        text: "",
        sources: [],
        related: [],
        frame: 0,
      };
    }

    function findSource(msg, n) {
      const withIds = msg.sources.some((s) => s.id !== undefined && s.id !== null);
      return withIds ? msg.sources.find((s) => String(s.id) === String(n)) : msg.sources[n - 1];
    }

    function citeFor(msg) {
      return (n, inLink) => {
        const sup = h("sup", { class: "cite" });
        const source = findSource(msg, n);
        const href = source && !inLink ? safeUrl(source.url) : null;
        if (href) {
          const label = source.title ? `${T.source} ${n}: ${source.title}` : `${T.source} ${n}`;
          sup.append(externalLink(href, String(n), { title: label, "aria-label": label }));
        } else {
          sup.append(h("span", { text: String(n) }));
        }
        return sup;
      };
    }

    function renderAnswer(msg) {
      if (msg.frame) cancelAnimationFrame(msg.frame);
      msg.frame = 0;
      keepingScroll(() => {
        msg.answer.replaceChildren(renderMarkdown(msg.text, { cite: citeFor(msg) }));
        msg.status.hidden = msg.text.length > 0;
      });
    }

    function scheduleRender(msg) {
      // Tokens arrive faster than frames; draw at most once per frame.
      if (!msg.frame) msg.frame = requestAnimationFrame(() => renderAnswer(msg));
    }

    function setStatus(msg, step, page) {
      const label = { searching: T.searching, reading: T.reading, answering: T.answering }[step];
      if (!label) return;
      // The page being read, when the assistant explores the site: "Reading Shipping…".
      let title = typeof page === "string" ? page.replace(/\s+/g, " ").trim() : "";
      if (title.length > 80) title = `${title.slice(0, 79)}…`;
      if (step === "reading" && title) {
        // Only the title gives way to a narrow bubble: "… lezen…" stays in sight.
        const [before, after] = T.readingPage.split("{page}");
        msg.statusText.replaceChildren(
          before, h("span", { class: "status-page", text: title }), after || "",
        );
      } else {
        msg.statusText.textContent = label;
      }
      msg.el.setAttribute("data-step", step);
    }

    function setSources(msg, list) {
      msg.sources = (Array.isArray(list) ? list : [])
        .filter((s) => s && typeof s === "object")
        .slice(0, 10)
        .map((s) => ({ id: s.id, url: s.url, title: typeof s.title === "string" ? s.title : "" }));
      const items = [];
      msg.sources.forEach((s, index) => {
        const href = safeUrl(s.url);
        if (!href) return;
        const label = clean(s.title) || href;
        const n = s.id !== undefined && s.id !== null ? s.id : index + 1;
        const number = h("span", { class: "n", text: `${n}.` });
        items.push(h("li", null, [number, externalLink(href, label)]));
      });
      keepingScroll(() => {
        msg.sourcesBox.replaceChildren();
        if (items.length) {
          const heading = h("p", { class: "sources-title", text: T.sources });
          msg.sourcesBox.append(heading, h("ol", null, items));
        }
        msg.sourcesBox.hidden = items.length === 0;
      });
      if (msg.text) renderAnswer(msg); // citation markers become links
    }

    /** "shop.example/en/returns": where a link leads, host and path. */
    function placeOf(href) {
      try {
        const url = new URL(href, window.location.href);
        let path = url.pathname.replace(/\/+$/, "");
        try {
          path = decodeURI(path);
        } catch (_) {
          /* not percent-encoded UTF-8: shown as it is */
        }
        return url.host.replace(/^www\./i, "") + path;
      } catch (_) {
        return href;
      }
    }

    /** Pages to read on, under the answer: small cards of title and address. */
    function setRelated(msg, list) {
      msg.related = (Array.isArray(list) ? list : [])
        .filter((r) => r && typeof r === "object" && safeUrl(r.url))
        .slice(0, 3)
        .map((r) => ({ url: r.url, title: typeof r.title === "string" ? r.title : "" }));
      const items = msg.related.map((r) => {
        const href = safeUrl(r.url);
        const where = placeOf(href);
        return h(
          "li",
          null,
          externalLink(
            href,
            [
              h("span", { class: "card-title", text: clean(r.title) || where }),
              h("span", { class: "card-where", text: where }),
            ],
            { class: "related-card" },
          ),
        );
      });
      keepingScroll(() => {
        msg.relatedBox.replaceChildren();
        if (items.length) {
          const heading = h("p", { class: "related-heading", text: T.related });
          msg.relatedBox.append(heading, h("ul", null, items));
        }
        msg.relatedBox.hidden = items.length === 0;
      });
    }

    function resetBot(msg) {
      if (msg.frame) cancelAnimationFrame(msg.frame);
      msg.frame = 0;
      msg.text = "";
      msg.sources = [];
      msg.el.className = "msg bot";
      msg.el.setAttribute("data-state", "waiting");
      msg.el.removeAttribute("data-step");
      msg.statusText.textContent = "";
      msg.status.hidden = false;
      msg.answer.replaceChildren();
      msg.sourcesBox.replaceChildren();
      msg.sourcesBox.hidden = true;
      msg.related = [];
      msg.relatedBox.replaceChildren();
      msg.relatedBox.hidden = true;
      const retry = msg.el.querySelector(".retry");
      if (retry) retry.remove();
    }

    function fail(msg, text, canRetry) {
      if (msg.frame) cancelAnimationFrame(msg.frame);
      msg.frame = 0;
      keepingScroll(() => {
        msg.text = "";
        msg.el.classList.add("error");
        msg.el.setAttribute("data-state", "error");
        msg.status.hidden = true;
        msg.sourcesBox.hidden = true;
        msg.relatedBox.hidden = true;
        msg.answer.replaceChildren(h("p", { text }));
        if (canRetry) {
          msg.answer.append(
            h("button", {
              type: "button",
              class: "retry",
              text: T.retry,
              onclick: () => {
                if (busy) return;
                resetBot(msg);
                run(msg, 0);
              },
            }),
          );
        }
      });
    }

    function sendFeedback(turn, rating, comment) {
      const headers = { "Content-Type": "application/json" };
      if (key) headers["X-Parley-Key"] = key;
      const body = { session_id: sessionId, turn_id: turn, rating };
      if (comment) body.comment = comment;
      return fetch(FEEDBACK_ENDPOINT, {
        method: "POST",
        headers,
        body: JSON.stringify(body),
        credentials: "omit",
        cache: "no-store",
      }).then(
        (response) => response.ok,
        () => false,
      );
    }

    /** Thumbs up / down under a finished answer; "down" offers a short comment box. The
     * choice shows as pressed and can be changed; `item` is the answer's history entry. */
    function addFeedback(msg, item) {
      const turn = item.turn;
      const note = h("p", { class: "feedback-note", role: "status", hidden: true });
      const textarea = h("textarea", { id: `${ids.panel}-fb-${turn}`, rows: 2, maxlength: 500 });
      const form = h("form", { class: "feedback-form", hidden: true }, [
        h("label", { for: textarea.id, text: T.commentLabel }),
        textarea,
        h("button", { type: "submit", text: T.sendComment }),
      ]);
      const buttons = {};
      function show(rating) {
        for (const name of Object.keys(buttons)) {
          buttons[name].setAttribute("aria-pressed", String(name === rating));
        }
      }
      function say(text) {
        note.textContent = text;
        note.hidden = !text;
      }
      async function rate(rating, comment) {
        const before = item.rating || null;
        item.rating = rating;
        show(rating);
        keepingScroll(() => {
          form.hidden = rating !== "down" || Boolean(comment);
          say("");
        });
        const ok = await sendFeedback(turn, rating, comment);
        keepingScroll(() => {
          if (!ok) {
            item.rating = before;
            show(before);
            form.hidden = true;
            say(T.feedbackFailed);
            return;
          }
          saveHistory();
          if (rating === "up" || comment) say(T.thanks);
        });
        if (ok && rating === "down" && !comment) textarea.focus();
      }
      for (const [rating, label] of [
        ["up", T.helpful],
        ["down", T.notHelpful],
      ]) {
        buttons[rating] = h(
          "button",
          {
            type: "button",
            class: `thumb ${rating}`,
            "aria-label": label,
            title: label,
            "aria-pressed": "false",
            "data-rating": rating,
            onclick: () => rate(rating, ""),
          },
          icon(rating),
        );
      }
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        const comment = textarea.value.trim();
        if (comment) rate("down", comment);
        else form.hidden = true;
      });
      const bar = h("div", { class: "feedback", role: "group", "aria-label": T.rate }, [
        h("span", { class: "feedback-label", "aria-hidden": "true", text: T.rate }),
        buttons.up,
        buttons.down,
        form,
        note,
      ]);
      show(item.rating || null);
      keepingScroll(() => msg.el.append(bar));
    }

    function finish(msg, done) {
      if (done.mode === "staff") {
        // Staff have the conversation: the question waits for them, the bot says nothing.
        msg.el.remove();
        if (done.handoff === "waiting_for_staff") note("waiting");
        setHandoff(done.handoff === "waiting_for_staff" ? "waiting_for_staff" : "staff");
        return;
      }
      if (typeof done.answer === "string" && done.answer.trim()) msg.text = done.answer;
      renderAnswer(msg);
      msg.status.hidden = true;
      msg.el.setAttribute("data-state", "done");
      if (done.low_confidence) msg.el.classList.add("low-confidence");
      if (typeof done.mode === "string") msg.el.setAttribute("data-mode", done.mode);
      const item = { role: "bot", text: msg.text, sources: msg.sources };
      if (msg.related.length) item.related = msg.related;
      if (Number.isSafeInteger(done.turn_id) && done.turn_id > 0 && done.mode !== "handoff") {
        item.turn = done.turn_id;
      }
      history.push(item);
      saveHistory();
      if (item.turn) addFeedback(msg, item);
      if (done.mode === "handoff") setHandoff("waiting_for_staff");
      else syncListening();
    }

    // ------------------------------------------------------------ talking to the gateway

    function httpMessage(status) {
      if (status === 429) return [T.rateLimited, true];
      if (status === 401 || status === 403 || status === 404) return [T.forbidden, false];
      if (status === 400 || status === 413 || status === 422) return [T.invalid, false];
      return [T.server, true];
    }

    function errorMessage(code) {
      if (code === "rate_limited") return [T.rateLimited, true];
      if (code === "forbidden" || code === "unauthorized") return [T.forbidden, false];
      return [T.failed, true];
    }

    /** Asks the question of `msg`; one automatic retry when the model fails (`llm_failed`). */
    async function run(msg, attempt) {
      const controller = new AbortController();
      const request = { controller };
      current = request;
      busy = true;
      updateSend();
      log.setAttribute("aria-busy", "true");
      msg.el.setAttribute("data-attempt", String(attempt + 1));
      let retry = false;
      try {
        retry = await stream(msg, attempt, controller);
      } finally {
        if (current === request) {
          current = null;
          busy = false;
          log.removeAttribute("aria-busy");
          updateSend();
        }
      }
      if (retry && !controller.signal.aborted) {
        resetBot(msg);
        await run(msg, attempt + 1);
      }
    }

    /** Streams one attempt into `msg`; resolves true when the question should be asked again. */
    async function stream(msg, attempt, controller) {
      const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
      if (key) headers["X-Parley-Key"] = key;
      const body = JSON.stringify({
        message: msg.question,
        session_id: sessionId,
        page: pageInfo(),
        language: pageLanguage,
        ...(HAS_FILTERS ? { filters: FILTERS } : {}),
      });
      let idle = 0;
      const arm = () => {
        clearTimeout(idle);
        idle = setTimeout(() => controller.abort(), IDLE_TIMEOUT_MS);
      };
      arm();
      let response;
      try {
        response = await fetch(ENDPOINT, {
          method: "POST",
          headers,
          body,
          credentials: "omit",
          cache: "no-store",
          signal: controller.signal,
        });
      } catch (_) {
        clearTimeout(idle);
        if (current && current.controller === controller) fail(msg, T.network, true);
        return false;
      }
      if (!response.ok || !/^text\/event-stream/i.test(response.headers.get("Content-Type") || "")) {
        clearTimeout(idle);
        if (response.body) response.body.cancel().catch(() => {});
        const [text, canRetry] = response.ok ? [T.server, true] : httpMessage(response.status);
        fail(msg, text, canRetry);
        return false;
      }

      let outcome = null; // "done" | "error" | "retry"
      const parser = createSseParser((event) => {
        if (outcome) return;
        let data;
        try {
          data = JSON.parse(event.data);
        } catch (_) {
          return; // not ours: ignore
        }
        if (!data || typeof data !== "object") return;
        switch (event.event) {
          case "status":
            setStatus(msg, data.step, data.page);
            break;
          case "token":
            if (typeof data.text === "string" && data.text) {
              msg.text += data.text;
              msg.el.setAttribute("data-state", "streaming");
              scheduleRender(msg);
            }
            break;
          case "sources":
            setSources(msg, data.sources);
            break;
          case "related":
            setRelated(msg, data.related);
            break;
          case "done":
            outcome = "done";
            finish(msg, data);
            break;
          case "error":
            if (data.code === "llm_failed" && attempt === 0) {
              outcome = "retry";
            } else {
              outcome = "error";
              const [text, canRetry] = errorMessage(data.code);
              fail(msg, text, canRetry);
            }
            break;
          default:
            break;
        }
      });

      const decoder = new TextDecoder();
      try {
        if (response.body && response.body.getReader) {
          const reader = response.body.getReader();
          while (!outcome) {
            const { value, done } = await reader.read();
            if (done) break;
            arm();
            parser.feed(decoder.decode(value, { stream: true }));
          }
          if (outcome) reader.cancel().catch(() => {});
        } else {
          parser.feed(await response.text());
        }
        if (!outcome) parser.feed(decoder.decode());
      } catch (_) {
        /* aborted or the connection broke: reported below */
      } finally {
        clearTimeout(idle);
        parser.end();
      }
      if (outcome === "retry") return true;
      // Cut off mid-stream (not by "New conversation"): the question can simply be asked again.
      if (!outcome && current && current.controller === controller) fail(msg, T.failed, true);
      return false;
    }

    // ------------------------------------------------------------ staff, live

    // What this session last saw of staff: the newest message id and the handoff status.
    const EVENTS_KEY = `parley:${agent}:events`;
    let seen = loadSeen();
    let events = null; // the EventSource while listening
    let relisten = 0; // timer of the next attempt after a refused stream
    let refusals = 0;

    function loadSeen() {
      try {
        const saved = JSON.parse(storage.get(EVENTS_KEY) || "null");
        if (saved && saved.session === sessionId && Number.isSafeInteger(saved.id)) return saved;
      } catch (_) {
        /* unreadable: start over */
      }
      return { session: sessionId, id: 0, status: "bot" };
    }
    function saveSeen() {
      storage.set(EVENTS_KEY, JSON.stringify(seen));
    }

    function note(name) {
      const last = history[history.length - 1];
      if (last && last.role === "note" && last.note === name) return;
      addNote(name);
      history.push({ role: "note", note: name });
      saveHistory();
    }

    function setHandoff(status) {
      if (!["bot", "waiting_for_staff", "staff"].includes(status)) return;
      seen.status = status;
      saveSeen();
      root.setAttribute("data-handoff", status);
      titleEl.textContent = status === "staff" ? T.withTeam : T.title;
      syncListening();
    }

    /** Listen while the panel is open, and while staff have the conversation even when it
     * is closed (a reply then marks the launcher); never before the first message. */
    function shouldListen() {
      return history.length > 0 && (!panel.hidden || seen.status !== "bot");
    }

    function syncListening() {
      if (shouldListen()) listen();
      else stopListening();
    }

    function stopListening() {
      clearTimeout(relisten);
      relisten = 0;
      if (events) events.close();
      events = null;
    }

    function listen() {
      if (events || relisten || typeof EventSource !== "function") return;
      const params = new URLSearchParams({ session_id: sessionId, key, since: String(seen.id) });
      const source = new EventSource(`${EVENTS_ENDPOINT}?${params}`);
      events = source;
      const data = (event) => {
        try {
          const parsed = JSON.parse(event.data);
          return parsed && typeof parsed === "object" ? parsed : null;
        } catch (_) {
          return null;
        }
      };
      // An event already shown (a replay after reconnecting) is skipped by its id.
      const fresh = (event) => {
        const id = Number(event.lastEventId);
        if (!Number.isSafeInteger(id) || id <= seen.id) return false;
        seen.id = id;
        saveSeen();
        return true;
      };
      source.addEventListener("open", () => {
        refusals = 0;
      });
      source.addEventListener("state", (event) => {
        const d = data(event);
        if (d) setHandoff(d.status);
      });
      source.addEventListener("staff", (event) => {
        const d = data(event);
        if (!d || typeof d.text !== "string" || !fresh(event)) return;
        addStaff(d.text);
        history.push({ role: "staff", text: d.text });
        saveHistory();
        if (panel.hidden) {
          launcher.classList.add("unread");
          launcher.setAttribute("aria-label", `${T.open} (${T.unread})`);
        }
      });
      source.addEventListener("typing", (event) => {
        const d = data(event);
        if (d && typeof d.staff === "string") showStaffTyping(d.staff.slice(0, 100));
      });
      source.addEventListener("handoff", (event) => {
        const d = data(event);
        if (!d || !fresh(event)) return;
        if (d.status === "staff" && seen.status !== "staff") note("joined");
        if (d.status === "bot" && seen.status === "staff") note("left");
        setHandoff(d.status);
      });
      source.addEventListener("error", () => {
        // While connecting again the browser retries by itself; closed means refused.
        if (source.readyState !== EventSource.CLOSED || events !== source) return;
        events = null;
        const wait = RELISTEN_MS[Math.min(refusals, RELISTEN_MS.length - 1)];
        refusals += 1;
        relisten = setTimeout(() => {
          relisten = 0;
          syncListening();
        }, wait);
      });
    }

    // ------------------------------------------------------------ controls

    function updateSend() {
      sendButton.disabled = busy || !input.value.trim();
    }

    function autosize() {
      input.style.height = "auto";
      input.style.height = `${Math.min(input.scrollHeight + 2, 128)}px`;
    }

    function send() {
      const text = input.value.trim();
      if (!text || busy) return;
      input.value = "";
      autosize();
      const greet = log.querySelector(".greeting");
      if (greet) greet.remove();
      addUser(text);
      history.push({ role: "user", text });
      saveHistory();
      const msg = addBot();
      msg.question = text;
      scrollToEnd();
      run(msg, 0);
    }

    function restore() {
      log.replaceChildren();
      history = loadHistory();
      if (!history.length) {
        log.append(greeting());
        return;
      }
      for (const item of history) {
        if (item.role === "user") {
          addUser(String(item.text || ""));
        } else if (item.role === "staff") {
          addStaff(String(item.text || ""));
        } else if (item.role === "note") {
          if (NOTES[item.note]) addNote(item.note);
        } else {
          const msg = addBot();
          msg.status.hidden = true;
          msg.el.setAttribute("data-state", "done");
          setSources(msg, item.sources);
          setRelated(msg, item.related);
          msg.text = String(item.text || "");
          renderAnswer(msg);
          if (Number.isSafeInteger(item.turn) && item.turn > 0) addFeedback(msg, item);
        }
      }
    }

    /** Asks the gateway to forget a finished session's memory. Best effort: a failure
     * never holds up the new conversation, which has a session id of its own anyway. */
    function forgetSession(id) {
      const headers = { "Content-Type": "application/json" };
      if (key) headers["X-Parley-Key"] = key;
      try {
        fetch(CLEAR_ENDPOINT, {
          method: "POST",
          headers,
          body: JSON.stringify({ session_id: id }),
          credentials: "omit",
          cache: "no-store",
          keepalive: true, // the visitor may leave the page right after
        }).catch(() => {});
      } catch (_) {
        /* fetch unavailable or refused synchronously: nothing to forget then */
      }
    }

    function newConversation() {
      if (current) current.controller.abort();
      current = null;
      busy = false;
      log.removeAttribute("aria-busy");
      if (history.length) forgetSession(sessionId);
      stopListening();
      sessionId = newSessionId();
      storage.set(SESSION_KEY, sessionId);
      seen = { session: sessionId, id: 0, status: "bot" };
      saveSeen();
      root.setAttribute("data-handoff", "bot");
      titleEl.textContent = T.title;
      storage.remove(HISTORY_KEY);
      history = [];
      log.replaceChildren(greeting());
      input.value = "";
      autosize();
      updateSend();
      input.focus();
    }

    function open() {
      if (!panel.hidden) return;
      panel.hidden = false;
      root.classList.add("open");
      launcher.setAttribute("aria-expanded", "true");
      launcher.setAttribute("aria-label", T.close);
      launcher.title = T.close;
      launcherIcon.replaceChildren(icon("close"));
      scrollToEnd();
      input.focus({ preventScroll: true });
      launcher.classList.remove("unread");
      syncListening();
    }

    function close() {
      if (panel.hidden) return;
      const hadFocus = shadow.activeElement !== null;
      panel.hidden = true;
      root.classList.remove("open");
      launcher.setAttribute("aria-expanded", "false");
      launcher.setAttribute("aria-label", T.open);
      launcher.title = T.open;
      launcherIcon.replaceChildren(icon("chat"));
      if (hadFocus) launcher.focus();
      syncListening();
    }

    launcher.addEventListener("click", () => (panel.hidden ? open() : close()));
    closeButton.addEventListener("click", close);
    newButton.addEventListener("click", newConversation);
    sendButton.addEventListener("click", send);
    input.addEventListener("input", () => {
      autosize();
      updateSend();
    });
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
        e.preventDefault();
        send();
      }
    });
    root.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && !panel.hidden) {
        e.stopPropagation();
        close();
      }
    });

    restore();
    setHandoff(seen.status);

    return {
      open,
      close,
      newConversation,
      get sessionId() {
        return sessionId;
      },
    };
  }

  function start() {
    const api = mount();
    window.ParleyWidget = Object.freeze({
      version: VERSION,
      agent,
      open: api.open,
      close: api.close,
      newConversation: api.newConversation,
      get sessionId() {
        return api.sessionId;
      },
      // For tests of the pure parts; not a stable interface.
      _internals: Object.freeze({ createSseParser, renderMarkdown, safeUrl, pageContext }),
    });
  }

  if (document.body) start();
  else document.addEventListener("DOMContentLoaded", start, { once: true });
})();
