// envgit ui: what JavaScript adds to the server-rendered page. Live updates (server-sent
// events) and the buttons that answer asks and confirm a rewind. No HTML is built from
// data here: rows and the asks panel come rendered (and escaped) by the server; results
// are written with textContent. The token is the page's own (data-token on <html>); a
// change is a POST with it in the X-Envgit-Token header.
"use strict";
(function () {
  const token = document.documentElement.dataset.token;
  const flash = document.getElementById("flash");

  function fragment(html) {
    const t = document.createElement("template");
    t.innerHTML = html;
    return t.content.firstElementChild;
  }

  async function post(path, body) {
    const r = await fetch(path + "?token=" + encodeURIComponent(token), {
      method: "POST", credentials: "same-origin", cache: "no-store",
      headers: {"Content-Type": "application/json", "X-Envgit-Token": token},
      body: JSON.stringify(body || {}),
    });
    let data = {};
    try { data = await r.json(); } catch (e) { data = {error: "HTTP " + r.status}; }
    if (!r.ok && !data.error) data.error = "HTTP " + r.status;
    return data;
  }

  // --- the asks panel: a step decides when it is redrawn -------------------------------
  // A step sends its next asked-about request whenever it likes, so a redraw must never put
  // a person's Enter or click on a button that allows: the focus stays on the same
  // question's same button, or, when that question is gone, on the panel itself (nothing
  // that answers); and an allowing button activated from the keyboard (a click whose detail
  // is 0: Enter or Space) within ALLOW_HOLD_MS of a redraw is not taken (the key may have
  // been meant for what had the focus before), Deny always is. A mouse click is aimed at
  // what the person sees under the pointer, and is taken.
  const ALLOW_HOLD_MS = 1000;
  let asksChanged = -Infinity;

  function keepFocus(panel, had) {
    const same = had.dataset && had.dataset.ask ? Array.from(panel.querySelectorAll("button[data-ask]"))
      .find((x) => x.dataset.ask === had.dataset.ask && x.dataset.answer === had.dataset.answer) : null;
    if (same) { same.focus(); return; }
    panel.tabIndex = -1;
    panel.focus();
  }

  // --- live ----------------------------------------------------------------------------
  function listen(url, onStep) {
    if (!url || !window.EventSource) return;
    const es = new EventSource(url);
    const live = document.getElementById("live");
    es.addEventListener("open", () => { if (live) live.hidden = false; });
    es.addEventListener("error", () => { if (live) live.hidden = true; });
    es.addEventListener("step", (ev) => onStep(JSON.parse(ev.data)));
    es.addEventListener("asks", (ev) => {
      const d = JSON.parse(ev.data);
      const old = document.getElementById("asks");
      const fresh = fragment(d.html);
      if (old && fresh) {
        const had = old.contains(document.activeElement) ? document.activeElement : null;
        old.replaceWith(fresh);
        asksChanged = performance.now();
        if (had) keepFocus(fresh, had);
      }
      document.title = (d.count ? "(" + d.count + ") " : "") + document.title.replace(/^\(\d+\) /, "");
    });
  }

  const table = document.getElementById("timeline");
  if (table) {
    listen(table.dataset.events, (d) => {
      const row = fragment(d.html);
      const have = document.getElementById("step-" + d.id);
      if (have) { have.replaceWith(row); return; }
      if (table.dataset.live !== "1") return;      // an older page: new steps are not on it
      const body = table.tBodies[0];
      let before = null;
      for (const tr of body.rows) { if (Number(tr.dataset.step) < d.id) { before = tr; break; } }
      body.insertBefore(row, before);
      row.classList.add("new");
      const empty = document.querySelector(".empty");
      if (empty) empty.remove();
    });
  }
  const head = document.getElementById("step-head");
  if (head) {
    listen(head.dataset.events, (d) => {
      if (Number(d.id) === Number(head.dataset.step) && !document.getElementById("rewind-result"))
        window.location.reload();
    });
  }

  // --- a folded directory (a virtualenv, node_modules): its files when it is opened -------
  // The server renders the fragment (escaped); without JavaScript the line's link shows them.
  // `toggle` does not bubble: it is caught on its way down.
  document.addEventListener("toggle", async (ev) => {
    const d = ev.target;
    if (!(d instanceof HTMLDetailsElement) || !d.open || !d.dataset.files || d.dataset.loaded) return;
    d.dataset.loaded = "1";
    const body = d.querySelector(".part-body");
    let r = null;
    try {
      r = await fetch(d.dataset.files, {credentials: "same-origin", cache: "no-store",
                                        headers: {"X-Envgit-Token": token}});
    } catch (e) { r = null; }
    const part = r && r.ok ? fragment(await r.text()) : null;
    if (!part) {
      delete d.dataset.loaded;
      const p = document.createElement("p");
      p.className = "note";
      p.textContent = "Not loaded" + (r ? ": HTTP " + r.status : "") + "; the link below shows them.";
      body.prepend(p);
      return;
    }
    body.replaceChildren(part);
  }, true);

  // --- buttons ---------------------------------------------------------------------------
  document.addEventListener("click", async (ev) => {
    const b = ev.target.closest("button");
    if (!b) return;
    if (b.dataset.answer && b.dataset.ask) {
      if (b.dataset.answer !== "deny" && ev.detail === 0 && performance.now() - asksChanged < ALLOW_HOLD_MS) {
        flash.textContent = "Question " + b.dataset.ask + ": not answered: the questions changed just "
          + "now; look again and press once more";
        return;
      }
      const art = b.closest(".ask");
      const out = art ? art.querySelector(".result") : null;
      art.querySelectorAll("button").forEach((x) => { x.disabled = true; });
      const d = await post("/asks/" + b.dataset.ask, {answer: b.dataset.answer});
      const said = "Question " + b.dataset.ask + ": " + (d.error ? "not answered: " + d.error
        : (d.answer === "allow" ? "Allowed" : "Denied") + (d.grant ? ", remembered as grant " + d.grant : ""));
      if (out) out.textContent = said;
      flash.textContent = said;            // stays when the panel is redrawn without the question
      if (d.error) art.querySelectorAll("button").forEach((x) => { x.disabled = false; });
    } else if (b.id === "rewind-confirm") {
      const out = document.getElementById("rewind-result");
      b.disabled = true;
      out.textContent = "Rewinding…";
      const d = await post("/steps/" + b.dataset.rewind + "/rewind", {policy: b.dataset.policy === "1"});
      if (d.error) { out.textContent = "Not rewound: " + d.error; b.disabled = false; return; }
      out.textContent = "Rewound: " + d.counts.write + " written, " + d.counts.delete
        + " deleted, recorded as step " + d.rewind_step + ". ";
      const a = document.createElement("a");
      a.href = d.url;
      a.textContent = "See step " + d.rewind_step;
      out.appendChild(a);
    }
  });
})();
