// The console's live feed: one websocket to /ws/live/ per page, reconnecting with backoff.
// Pages subscribe with Phalanx.live.on(type, fn) for "history", "snapshot", "node", "node_removed".
(function () {
  "use strict";
  const handlers = {};
  const seenEvents = new Set();
  let socket = null, backoff = 500;

  function on(type, fn) { (handlers[type] = handlers[type] || []).push(fn); }
  function emit(type, msg) { (handlers[type] || []).forEach(fn => { try { fn(msg); } catch (e) { console.error(e); } }); }
  function status(ok) {
    const el = document.getElementById("live-status");
    if (el) { el.className = "live " + (ok ? "on" : "off"); el.title = ok ? "live feed connected" : "live feed reconnecting"; }
  }
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}/ws/live/`);
    socket.onopen = () => { backoff = 500; status(true); };
    socket.onmessage = (e) => {
      const msg = JSON.parse(e.data);
      if (msg.type === "history") emit("history", msg.snapshots);
      else if (msg.type === "snapshot") emit("snapshot", msg.snapshot);
      else if (msg.type === "node") emit("node", msg);
      else if (msg.type === "node_removed") emit("node_removed", msg.node_id);
    };
    socket.onclose = (e) => {
      status(false);
      if (e.code === 4401 || e.code === 4403) return;
      setTimeout(connect, backoff); backoff = Math.min(backoff * 2, 10000);
    };
  }

  // One time format on every page, in the operator's (the browser's) time zone, zone shown:
  // "2026-12-01 23:33:05 GMT+1". The server writes <time datetime="ISO"> in its own zone
  // (console/templatetags/console_format.py); every such element is redrawn here, new ones too.
  const TIME = new Intl.DateTimeFormat("en-US", {year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short"});
  function when(iso) {
    const d = iso instanceof Date ? iso : new Date(iso);
    if (iso == null || iso === "" || isNaN(d)) return "—";
    const p = Object.fromEntries(TIME.formatToParts(d).map(x => [x.type, x.value]));
    return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second} ${p.timeZoneName}`;
  }
  function timeHtml(iso) { return iso ? `<time datetime="${esc(iso)}">${esc(when(iso))}</time>` : "—"; }
  function showTimes(root) {
    (root || document).querySelectorAll("time[datetime]").forEach(t => {
      if (t.dataset.shown === t.getAttribute("datetime")) return;
      t.textContent = when(t.getAttribute("datetime"));
      t.dataset.shown = t.getAttribute("datetime");
    });
  }
  function watchTimes() {
    showTimes(document);
    new MutationObserver(() => showTimes(document)).observe(document.body, {subtree: true, childList: true, attributes: true, attributeFilter: ["datetime"]});
  }

  function esc(s) { return String(s == null ? "" : s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c])); }
  function fmt(v, digits) { return v == null ? "–" : Number(v).toFixed(digits === undefined ? 1 : digits); }

  // Update every element of node `id`: state badge, drain/undrain buttons, fields.
  function applyNode(id, fields) {
    document.querySelectorAll(`[data-node="${CSS.escape(id)}"]`).forEach(row => {
      if (fields.state) {
        // the badge reads what a person needs (serving, validating, restarting, down ...);
        // the raw state only decides which of drain/undrain is offered
        const badge = fields.badge || fields.state;
        row.querySelectorAll('[data-field="state"]').forEach(b => { b.textContent = badge; b.className = "state state-" + badge.replace(/ /g, "-"); b.dataset.state = fields.state; });
        row.querySelectorAll('[data-show-when="draining"]').forEach(f => { f.hidden = fields.state !== "draining"; });
        row.querySelectorAll('[data-show-when="not-draining"]').forEach(f => { f.hidden = fields.state === "draining"; });
        row.classList.remove("removed");
      }
      for (const [key, value] of Object.entries(fields)) {
        if (key === "state" || key === "badge") continue;
        row.querySelectorAll(`[data-field="${key}"]`).forEach(c => {
          if (c.tagName === "TIME") { c.hidden = !value; if (value) c.setAttribute("datetime", value); return; }
          c.textContent = value == null || value === "" ? "—" : value;
        });
      }
    });
  }

  function bindNodesTable() {
    const table = document.getElementById("nodes-table");
    on("node", msg => applyNode(msg.node.node_id, {state: msg.node.state, badge: msg.node.badge, error: msg.node.error, error_at: msg.node.error_at, failures: msg.node.failures, validation: msg.node.validation}));
    on("node_removed", id => document.querySelectorAll(`[data-node="${CSS.escape(id)}"]`).forEach(r => r.classList.add("removed")));
    on("snapshot", snap => {
      for (const [id, n] of Object.entries(snap.nodes)) {
        if (table && !table.querySelector(`tr[data-node="${CSS.escape(id)}"]`)) {
          const tbody = table.querySelector("tbody");
          tbody.querySelectorAll("tr.empty").forEach(r => r.remove());
          const tr = document.createElement("tr");
          tr.dataset.node = id;
          const cols = table.querySelectorAll("thead th").length;
          tr.innerHTML = `<td><a href="/nodes/${encodeURIComponent(id)}/">${esc(id)}</a></td><td class="mono">${esc(n.address)}</td><td><span data-field="state"></span></td><td><a href="/validation/${encodeURIComponent(id)}/" data-field="validation"></a></td><td>${esc(n.package || "—")}</td><td></td><td data-field="sessions"></td><td data-field="load"></td><td data-field="tps"></td><td data-field="cpu"></td><td class="err"><span data-field="error"></span> <time data-field="error_at" hidden></time></td>` + (cols > 11 ? "<td><small>reload for actions</small></td>" : "");
          tbody.appendChild(tr);
        }
        const load = n.total ? ((n.active || 0) + (n.queue || 0)) / n.total : null;
        applyNode(id, {state: n.state, badge: n.badge, validation: n.validation, sessions: n.sessions, error: n.error, error_at: n.error_at, tps: n.ok ? fmt((n.decode_tps || 0) + (n.prefill_tps || 0)) : "–",
                       cpu: fmt(n.cpu), load: load == null ? "?" : load.toFixed(2)});
      }
      if (table) table.querySelectorAll("tbody tr[data-node]").forEach(r => r.classList.toggle("removed", !(r.dataset.node in snap.nodes)));
    });
  }

  // What a draining node still holds, and whether stopping it now cuts anything.
  function drainText(n) {
    const streams = n.active || 0, pinned = n.sessions || 0;
    if (streams > 0) return `Draining: ${streams} stream${streams === 1 ? "" : "s"} in flight and ${pinned} session${pinned === 1 ? "" : "s"} pinned here. Not safe to stop: it would cut the streams.`;
    if (pinned > 0) return `Draining: no streams in flight; ${pinned} session${pinned === 1 ? "" : "s"} still pinned here (each moves with its KV at its next turn). Safe to stop; stopping now makes them prefill again elsewhere.`;
    return "Drained: no streams in flight, no sessions pinned. Safe to stop.";
  }
  function bindDrainStatus(nodeId) {
    const box = document.getElementById("drain-status");
    if (!box) return;
    on("snapshot", snap => {
      const n = snap.nodes[nodeId];
      box.hidden = !n || n.state !== "draining";
      if (n && n.state === "draining") {
        box.textContent = n.ok ? drainText(n) : "Draining: the node does not answer its metrics; what it still holds is unknown.";
        box.dataset.safe = String(n.ok && !(n.active > 0));
      }
    });
  }

  function addEvent(ev, nodeFilter) {
    if (!ev || seenEvents.has(ev.id) || (nodeFilter && ev.node_id !== nodeFilter)) return;
    seenEvents.add(ev.id);
    const list = document.getElementById("events");
    if (!list || list.querySelector(`[data-event="${ev.id}"]`)) return;
    list.querySelectorAll(".empty").forEach(e => e.remove());
    const li = document.createElement("li");
    li.dataset.event = ev.id;
    li.className = "fresh";
    li.innerHTML = `${timeHtml(ev.at)} ${nodeFilter ? "" : `<a href="/nodes/${encodeURIComponent(ev.node_id)}/">${esc(ev.node_id)}</a> `}<b class="kind-${esc(ev.kind)}">${esc(ev.label)}</b> ${esc(ev.message)}${ev.actor ? ` <span class="actor">by ${esc(ev.actor)}</span>` : ""}`;
    list.prepend(li);
  }
  function bindEvents(nodeFilter) {
    on("node", msg => addEvent(msg.event, nodeFilter));
    on("snapshot", snap => (snap.events || []).forEach(ev => addEvent(ev, nodeFilter)));
  }
  function bindTiles() {
    on("snapshot", snap => {
      const nodes = Object.values(snap.nodes);
      const set = (id, v) => { const el = document.getElementById(id); if (el) el.textContent = v; };
      const serving = nodes.filter(n => n.serving).length;
      const notServing = nodes.filter(n => !n.serving && !["down", "draining"].includes(n.badge)).length;
      const downs = nodes.filter(n => n.badge === "down").length, errors = nodes.filter(n => n.recent_error).length;
      set("tile-serving", serving); set("tile-not-serving", notServing); set("tile-down", downs);
      set("tile-draining", nodes.filter(n => n.badge === "draining").length);
      const tone = (id, cls, on) => { const el = document.getElementById(id); if (el) el.parentElement.classList.toggle(cls, on); };
      tone("tile-serving", "tile-good", serving > 0); tone("tile-not-serving", "tile-warn", notServing > 0);
      tone("tile-down", "tile-bad", downs > 0); tone("tile-errors", "tile-bad", errors > 0);
      set("tile-tps", fmt(nodes.reduce((a, n) => a + (n.decode_tps || 0), 0)));
      set("tile-errors", errors);
      set("tile-sessions", nodes.reduce((a, n) => a + (n.sessions || 0), 0));
    });
  }
  // Re-fetch an HTML fragment into element `id` every `ms` (pauses while the tab is hidden).
  function refresh(id, url, ms) {
    setInterval(async () => {
      if (document.hidden) return;
      try {
        const r = await fetch(url, {credentials: "same-origin"});
        if (r.ok) document.getElementById(id).innerHTML = await r.text();
      } catch (e) { /* next time */ }
    }, ms);
  }

  window.Phalanx = {live: {on}, bindNodesTable, bindDrainStatus, bindEvents, bindTiles, refresh, esc, fmt, when, timeHtml};
  document.addEventListener("DOMContentLoaded", connect);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watchTimes); else watchTimes();
  if (document.readyState !== "loading") setTimeout(connect, 0);
})();
