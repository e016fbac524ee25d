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
    });
  }

  // Tell the customer staff are writing: at most once every few seconds while typing.
  const TYPING_EVERY_MS = 4000;
  let typingSent = 0;
  if (reply && reply.dataset.typing) {
    reply.addEventListener("input", () => {
      const now = Date.now();
      if (!reply.value.trim() || now - typingSent < TYPING_EVERY_MS) return;
      typingSent = now;
      fetch(reply.dataset.typing, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRF-Token": csrf() },
      }).catch(() => {});
    });
  }

  // ------------------------------------------------------------ keyboard shortcuts

  const SHORTCUTS = [
    ["j / k", "next / previous conversation in the list"],
    ["o or Enter", "open the chosen conversation"],
    ["/", "search conversations"],
    ["r", "write a reply"],
    ["n", "write an internal note"],
    ["e", "resolve (hands the conversation back to the bot)"],
    ["a", "assign to me"],
    ["?", "show these shortcuts"],
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
      const table = document.createElement("dl");
      for (const [keys, what] of SHORTCUTS) {
        const dt = document.createElement("dt");
        dt.textContent = keys;
        const dd = document.createElement("dd");
        dd.textContent = what;
        table.append(dt, dd);
      }
      const close = document.createElement("button");
      close.type = "button";
      close.textContent = "Close";
      close.addEventListener("click", () => help.close());
      help.append(title, table, close);
      document.body.append(help);
    }
    if (help.open) help.close();
    else help.showModal();
  }

  document.querySelector("[data-shortcuts-help]")?.addEventListener("click", toggleHelp);

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
    const actions = {
      j: () => select(selected + 1),
      k: () => select(selected - 1),
      o: () => rows()[selected]?.querySelector("a")?.click(),
      "/": () => focus("#filter-q"),
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

  if (list) follow();
})();
