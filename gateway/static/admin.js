// The staff console's progressive enhancement: every page works without it, except the
// playground, which streams its answer.
(function () {
  "use strict";

  var csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  // Destructive buttons ask first.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  // What is still changing (sources being indexed, a conversation with staff) is brought up
  // to date from the page itself until it has settled.
  function refresh(holder) {
    var id = holder.getAttribute("data-refresh");
    window.setTimeout(function () {
      fetch(window.location.pathname, { credentials: "same-origin" })
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) {
          if (!html) return;
          var fresh = new DOMParser().parseFromString(html, "text/html");
          var table = fresh.getElementById(id);
          var current = document.getElementById(id);
          var still = fresh.querySelector("[data-refresh]");
          if (table && current && table.outerHTML !== current.outerHTML) {
            current.replaceWith(document.adoptNode(table));
          }
          if (still) refresh(holder);
          else holder.removeAttribute("data-refresh");
        })
        .catch(function () { /* the next page load shows the state */ });
    }, 3000);
  }
  document.querySelectorAll("[data-refresh]").forEach(refresh);

  // -- approved templates: one is chosen at a time, its preview filled in as staff type ------

  function fillPreview(form) {
    var preview = form.querySelector("[data-preview]");
    if (!preview) return;
    var text = preview.getAttribute("data-template-text") || "";
    form.querySelectorAll("input[data-placeholder]").forEach(function (input) {
      var value = input.value.trim();
      if (value) text = text.split("{{" + input.getAttribute("data-placeholder") + "}}").join(value);
    });
    preview.textContent = text;
  }

  document.querySelectorAll("[data-template-picker]").forEach(function (picker) {
    var choice = picker.querySelector("[data-template-choice]");
    var forms = Array.prototype.slice.call(picker.querySelectorAll("form[data-template]"));
    function show() {
      forms.forEach(function (form) {
        form.hidden = form.getAttribute("data-template") !== choice.value;
      });
    }
    if (choice && forms.length > 1) {
      choice.closest(".template-choice").hidden = false;
      picker.classList.add("enhanced");
      choice.addEventListener("change", show);
      show();
    }
    forms.forEach(function (form) {
      form.addEventListener("input", function () { fillPreview(form); });
      fillPreview(form);
    });
  });

  // -- the playground ------------------------------------------------------------------------

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function safeUrl(url) {
    return typeof url === "string" && /^(https?:\/\/|\/(?!\/))/i.test(url) ? url : null;
  }

  function percent(value) {
    return typeof value === "number" ? Math.round(value * 100) + "%" : "–";
  }

  function number(value) {
    return typeof value === "number" ? value.toFixed(3) : "–";
  }

  // Server-sent events from a fetch body: frames end at a blank line, in any chunking.
  function readEvents(response, onEvent) {
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var buffer = "";
    function frame(text) {
      var kind = "message";
      var data = [];
      text.split(/\r\n|\r|\n/).forEach(function (line) {
        if (line.indexOf("event:") === 0) kind = line.slice(6).trim();
        else if (line.indexOf("data:") === 0) data.push(line.slice(5).replace(/^ /, ""));
      });
      if (!data.length) return;
      var parsed;
      try { parsed = JSON.parse(data.join("\n")); } catch (e) { return; }
      onEvent(kind, parsed);
    }
    function pump() {
      return reader.read().then(function (chunk) {
        if (chunk.done) {
          buffer += decoder.decode();
          if (buffer.trim()) frame(buffer);
          return;
        }
        buffer += decoder.decode(chunk.value, { stream: true });
        var parts = buffer.split(/\r\n\r\n|\n\n|\r\r/);
        buffer = parts.pop();
        parts.forEach(frame);
        return pump();
      });
    }
    return pump();
  }

  function table(caption, headings, rows) {
    var t = el("table");
    t.appendChild(el("caption", "", caption));
    var head = el("tr");
    headings.forEach(function (h) {
      var th = el("th", "", h);
      th.scope = "col";
      head.appendChild(th);
    });
    t.appendChild(el("thead")).appendChild(head);
    var body = t.appendChild(el("tbody"));
    rows.forEach(function (cells) {
      var tr = body.appendChild(el("tr"));
      cells.forEach(function (cell) { tr.appendChild(el("td", "", cell)); });
    });
    var wrap = el("div", "table-wrap");
    wrap.appendChild(t);
    return wrap;
  }

  function showDiagnostics(holder, data) {
    holder.textContent = "";
    var turn = data.turn || {};
    var facts = el("dl", "diagnostics-facts");
    [
      ["Question", turn.question],
      ["Search query", turn.rewritten_query || turn.question],
      ["Answered by", turn.mode],
      ["Knowledge match", percent(turn.confidence) + (turn.low_confidence ? " (low)" : "")],
      ["Overrides", Object.keys(data.overrides || {}).map(function (k) {
        return k + ": " + data.overrides[k];
      }).join(", ") || "none"],
    ].forEach(function (pair) {
      facts.appendChild(el("dt", "", pair[0]));
      facts.appendChild(el("dd", "", pair[1] === undefined ? "–" : pair[1]));
    });
    holder.appendChild(facts);
    var retrieved = turn.retrieved || [];
    if (retrieved.length) {
      holder.appendChild(table("Retrieved sources", ["Source", "Match", "Score", "Used"],
        retrieved.map(function (r) {
          return [r.url, number(r.match), number(r.score), r.passed ? "yes" : "no"];
        })));
    } else {
      holder.appendChild(el("p", "muted", "Nothing was retrieved."));
    }
    var timings = turn.timings_ms || {};
    var steps = ["curated", "rewrite", "retrieve", "rerank", "generate"];
    function rank(name) {
      var known = steps.indexOf(name);
      return (name === "total" ? 100 : 0) + (known < 0 ? steps.length : known);
    }
    var names = Object.keys(timings).sort(function (a, b) {
      return rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0);
    });
    if (names.length) {
      holder.appendChild(el("p", "timings", "Timings: " + names.map(function (name) {
        return name + " " + Math.round(timings[name]) + " ms";
      }).join(", ")));
    }
    var raw = el("details");
    raw.appendChild(el("summary", "", "Full trace"));
    raw.appendChild(el("pre", "", JSON.stringify(data, null, 2)));
    holder.appendChild(raw);
  }

  function playground(root) {
    var form = root.querySelector("form");
    var log = root.querySelector("[data-log]");
    var diagnostics = root.querySelector("[data-diagnostics]");
    var endpoint = root.getAttribute("data-endpoint");
    var session = null;
    var busy = false;

    root.querySelector("[data-new-chat]").addEventListener("click", function () {
      session = null;
      log.textContent = "";
      diagnostics.textContent = "";
      diagnostics.appendChild(el("p", "muted", "Send a message to see how it was answered."));
      form.elements.message.focus();
    });

    form.elements.message.addEventListener("keydown", function (event) {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        form.requestSubmit();
      }
    });

    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var message = form.elements.message.value.trim();
      if (!message || busy) return;
      busy = true;
      root.setAttribute("aria-busy", "true");
      var asked = log.appendChild(el("li", "msg visitor"));
      asked.appendChild(el("p", "who")).appendChild(el("strong", "", "You"));
      asked.appendChild(el("div", "text", message));
      var reply = log.appendChild(el("li", "msg assistant"));
      reply.setAttribute("data-state", "waiting");
      reply.appendChild(el("p", "who")).appendChild(el("strong", "", "Assistant"));
      var status = reply.appendChild(el("p", "status muted", "Sending…"));
      var answer = reply.appendChild(el("div", "text answer"));
      form.elements.message.value = "";

      var body = { message: message, diagnostics: true };
      if (session) body.session_id = session;
      ["language", "segment", "site_type"].forEach(function (name) {
        var value = form.elements[name].value.trim();
        if (value) body[name] = value;
      });
      var pageUrl = form.elements.page_url.value.trim();
      if (pageUrl) body.page = { url: pageUrl };

      var steps = { searching: "Searching…", reading: "Reading…", answering: "Answering…" };
      fetch(endpoint, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
        body: JSON.stringify(body),
      }).then(function (response) {
        var type = response.headers.get("Content-Type") || "";
        if (!response.ok || type.indexOf("text/event-stream") !== 0) {
          return response.text().then(function (text) {
            var said = "The playground could not answer (HTTP " + response.status + ").";
            try { said = JSON.parse(text).error.message || said; } catch (e) { /* not JSON */ }
            throw new Error(said);
          });
        }
        session = response.headers.get("X-Parley-Session") || session;
        reply.setAttribute("data-state", "streaming");
        return readEvents(response, function (kind, data) {
          if (kind === "status") {
            status.textContent = data.step === "reading" && typeof data.page === "string"
              ? "Reading " + data.page + "…"
              : steps[data.step] || data.step;
          } else if (kind === "token") {
            status.hidden = true;
            answer.textContent += data.text;
          } else if (kind === "sources") {
            var sources = data.sources || [];
            if (!sources.length) return;
            var list = el("ol", "sources");
            sources.forEach(function (s) {
              var item = list.appendChild(el("li"));
              var url = safeUrl(s.url);
              var label = (s.title || s.url) + " (" + percent(s.score) + ")";
              if (url) {
                var link = item.appendChild(el("a", "", label));
                link.href = url;
                link.target = "_blank";
                link.rel = "noopener";
              } else {
                item.textContent = label;
              }
            });
            var holder = el("div", "sources-block");
            holder.appendChild(el("p", "", "Sources"));
            holder.appendChild(list);
            reply.appendChild(holder);
          } else if (kind === "done") {
            status.hidden = true;
            answer.textContent = data.answer;
            session = session || data.session_id;
            var meta = el("p", "meta", "knowledge match " + percent(data.confidence));
            if (data.low_confidence) meta.classList.add("low");
            reply.appendChild(meta);
            reply.setAttribute("data-state", "done");
          } else if (kind === "error") {
            status.hidden = false;
            status.textContent = data.message || data.code;
            reply.setAttribute("data-state", "error");
          } else if (kind === "diagnostics") {
            session = data.session_id || session;
            showDiagnostics(diagnostics, data);
          }
        });
      }).catch(function (error) {
        status.hidden = false;
        status.textContent = error.message;
        reply.setAttribute("data-state", "error");
      }).then(function () {
        if (reply.getAttribute("data-state") === "streaming") {
          reply.setAttribute("data-state", "error");
          status.hidden = false;
          status.textContent = "The answer stopped before it was complete.";
        }
        busy = false;
        root.removeAttribute("aria-busy");
      });
    });
  }
  document.querySelectorAll("[data-playground]").forEach(playground);
})();
