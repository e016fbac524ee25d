// Tells staff who waits for a person, on every console page: a count in the tab title and
// the header, and a browser notification (once allowed) when a customer asks for a person
// or has waited too long. Follows GET /admin/events/waiting (server-sent events).
(function () {
  "use strict";
  if (!window.EventSource) return;
  var baseTitle = document.title.replace(/^\(\d+\)\s*/, "");
  var badge = document.querySelector("[data-waiting]");
  var button = document.querySelector("[data-notify-on]");
  var canNotify = "Notification" in window;

  function showButton() {
    if (!button) return;
    button.hidden = !canNotify || Notification.permission !== "default";
  }
  if (button) {
    button.addEventListener("click", function () {
      // Asked on a click: browsers ignore (or block) a request made without one.
      var asked = Notification.requestPermission(showButton);
      if (asked && asked.then) asked.then(showButton);
    });
  }
  showButton();

  function setCount(count) {
    document.title = count > 0 ? "(" + count + ") " + baseTitle : baseTitle;
    if (!badge) return;
    badge.hidden = count <= 0;
    badge.textContent = count === 1 ? "1 waiting" : count + " waiting";
    badge.setAttribute("aria-label", count + " conversation" + (count === 1 ? "" : "s") + " waiting for staff");
  }

  var events = new EventSource("/admin/events/waiting");
  events.addEventListener("waiting", function (e) {
    setCount(JSON.parse(e.data).count);
  });
  events.addEventListener("notification", function (e) {
    var n = JSON.parse(e.data);
    if (!canNotify || Notification.permission !== "granted") return;
    var who = n.customer || "A customer";
    var title = n.type === "handoff.requested" ? who + " asked for a person" : who + " is waiting";
    var shown = new Notification(title, {
      body: n.agent + " · " + n.channel,
      tag: "parley-" + n.conversation_id,
    });
    shown.onclick = function () {
      window.focus();
      window.location.href = n.url;
    };
  });
})();
