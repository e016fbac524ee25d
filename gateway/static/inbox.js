// The staff console's inbox: the conversation list refreshing live, keyboard shortcuts,
// saved replies inserted into the reply box, and "staff is typing" sent to the widget.
(() => {
  "use strict";

  const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content || "";

  // ------------------------------------------------------------ the live list

  const list = document.querySelector("[data-live-list]");
  let selected = -1;

  const rows = () => Array.from(document.querySelectorAll("#conversation-list tbody tr"));

  function select(index) {
    const all = rows();
    if (!all.length) return;
    selected = Math.max(0, Math.min(index, all.length - 1));
    all.forEach((row, i) => row.classList.toggle("selected", i === selected));
    all[selected].scrollIntoView({ block: "nearest" });
    all[selected].querySelector("a")?.focus({ preventScroll: true });
  }

  async function refresh() {
    const response = await fetch(location.href, { credentials: "same-origin" });
    if (!response.ok) return;
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = page.querySelector("[data-live-list]");
    if (!fresh || !list) return;
    const keep = rows()[selected]?.dataset.conversation;
    list.innerHTML = fresh.innerHTML;
    list.dataset.version = fresh.dataset.version || list.dataset.version;
    if (keep) {
      const index = rows().findIndex((row) => row.dataset.conversation === keep);
      if (index >= 0) select(index);
    }
  }

  async function follow() {
    let failures = 0;
    for (;;) {
      try {
        const since = encodeURIComponent(list.dataset.version || "");
        const response = await fetch(`/api/v1/admin/conversations/changes?since=${since}`, {
          credentials: "same-origin",
          headers: { Accept: "application/json" },
        });
        if (!response.ok) throw new Error(String(response.status));
        const answer = await response.json();
        failures = 0;
        if (answer.version !== list.dataset.version) {
          await refresh();
          list.dataset.version = answer.version;
        }
      } catch (_) {
        failures += 1;
        // The server is away (a restart, the network): try again, less and less often.
        await new Promise((done) => setTimeout(done, Math.min(30000, 1000 * 2 ** failures)));
      }
    }
  }

  // ------------------------------------------------------------ the reply box

  const reply = document.getElementById("reply-text");
  const saved = document.querySelector("[data-saved-reply]");
  if (saved && reply) {
    saved.addEventListener("change", () => {
      if (!saved.value) return;
      const start = reply.selectionStart ?? reply.value.length;
      const end = reply.selectionEnd ?? reply.value.length;
      reply.value = reply.value.slice(0, start) + saved.value + reply.value.slice(end);
      reply.focus();
      reply.selectionStart = reply.selectionEnd = start + saved.value.length;
      saved.value = "";
      // Set by script, so no input event: the customer is told here.
      signalTyping();
    });
  }

  // Tell the customer staff are writing: at most once every few seconds while typing (the
  // widget shows it for a few seconds more than that, so steady typing shows steadily).
  const TYPING_EVERY_MS = 4000;
  let typingSent = 0;
  function signalTyping() {
    if (!reply || !reply.dataset.typing) return;
    const now = Date.now();
    if (!reply.value.trim() || now - typingSent < TYPING_EVERY_MS) return;
    typingSent = now;
    fetch(reply.dataset.typing, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRF-Token": csrf() },
    }).catch(() => {});
  }
  if (reply) reply.addEventListener("input", signalTyping);

  // ------------------------------------------------------------ keyboard shortcuts

  // Where each works: the help says so, since a key that does nothing on a page looks broken.
  const SHORTCUTS = [
    ["In the conversation list", [
      ["j / k", "next / previous conversation"],
      ["o or Enter", "open the chosen conversation"],
    ]],
    ["In a conversation", [
      ["r", "write a reply"],
      ["n", "write an internal note"],
      ["e", "resolve (hands the conversation back to the bot)"],
      ["a", "assign to me"],
    ]],
    ["Anywhere", [
      ["/", "search conversations"],
      ["?", "show or hide these shortcuts"],
      ["Esc", "leave a text box, so the keys work again"],
    ]],
  ];
  let help = null;

  function toggleHelp() {
    if (!help) {
      help = document.createElement("dialog");
      help.className = "shortcuts";
      help.setAttribute("aria-labelledby", "shortcuts-title");
      const title = document.createElement("h2");
      title.id = "shortcuts-title";
      title.textContent = "Keyboard shortcuts";
      help.append(title);
      for (const [where, keys] of SHORTCUTS) {
        const heading = document.createElement("h3");
        heading.textContent = where;
        const table = document.createElement("dl");
        for (const [key, what] of keys) {
          const dt = document.createElement("dt");
          dt.textContent = key;
          const dd = document.createElement("dd");
          dd.textContent = what;
          table.append(dt, dd);
        }
        help.append(heading, table);
      }
      const close = document.createElement("button");
      close.type = "button";
      close.textContent = "Close";
      close.addEventListener("click", () => help.close());
      help.append(close);
      document.body.append(help);
    }
    if (help.open) help.close();
    else help.showModal();
  }

  document.querySelector("[data-shortcuts-help]")?.addEventListener("click", toggleHelp);

  const SEARCH_PAGE = "/admin/conversations";
  const click = (selector) => document.querySelector(selector)?.click();
  const focus = (selector) => {
    const el = document.querySelector(selector);
    if (!el) return false;
    el.scrollIntoView({ block: "center" });
    el.focus();
    return true;
  };

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const target = event.target;
    if (target instanceof HTMLElement && target.closest("input, textarea, select, [contenteditable]")) {
      if (event.key === "Escape") target.blur();
      return;
    }
    // The help is modal: behind it nothing may be resolved or assigned by a stray key.
    if (help?.open && event.key !== "?") return;
    const actions = {
      j: () => select(selected + 1),
      k: () => select(selected - 1),
      o: () => rows()[selected]?.querySelector("a")?.click(),
      // Searching is the list's: elsewhere "/" goes there, and the search box is focused.
      "/": () => focus("#filter-q") || location.assign(`${SEARCH_PAGE}#search`),
      r: () => focus("#reply-text"),
      n: () => focus("#note-text"),
      e: () => click('[data-shortcut="resolve"]'),
      a: () => click('[data-shortcut="assign-me"]'),
      "?": toggleHelp,
    };
    const action = actions[event.key];
    if (!action) return;
    event.preventDefault();
    action();
  });

  if (location.hash === "#search") focus("#filter-q");
  if (list) follow();
})();
