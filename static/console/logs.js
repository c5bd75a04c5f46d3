// The Logs page's live tail: /ws/logs/?<the page's filters>&after=<newest id shown> sends each
// new matching record; they go on top of the table (newest first).
(function () {
  "use strict";
  const table = document.getElementById("log-records"), box = document.getElementById("log-tail");
  if (!table || !box) return;
  const status = document.getElementById("log-tail-status");
  const esc = window.Phalanx.esc;
  let socket = null, newest = table.dataset.newest || "0";

  function link(key, value, cls) {
    return value ? `<a href="?${key}=${encodeURIComponent(value)}"${cls ? ` class="${cls}"` : ""}>${esc(value)}</a>` : "";
  }
  function row(r) {
    const tr = document.createElement("tr");
    tr.className = "level-" + r.level;
    tr.dataset.id = r.id;
    const fields = Object.entries(r.fields || {}).map(([k, v]) => `${esc(k)}=${esc(typeof v === "string" ? v : JSON.stringify(v))}`).join(" ");
    tr.innerHTML = `<td>${window.Phalanx.timeHtml(r.time)}</td><td>${esc(r.level)}</td><td>${esc(r.process)}</td><td>${link("node_id", r.node_id)}</td><td class="mono">${esc(r.event)}</td><td>${link("session_id", r.session_id)}</td><td>${link("request_id", r.request_id, "mono")}</td><td class="mono small">${fields}</td>`;
    return tr;
  }
  function start() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = table.dataset.query ? table.dataset.query + "&" : "";
    socket = new WebSocket(`${scheme}://${location.host}/ws/logs/?${query}after=${newest}`);
    socket.onopen = () => { status.textContent = "following new records"; };
    socket.onmessage = (e) => {
      const msg = JSON.parse(e.data);
      if (msg.type === "error") { status.textContent = msg.message; return; }
      if (msg.type !== "records") return;
      const body = table.querySelector("tbody");
      body.querySelectorAll("tr.empty").forEach(r => r.remove());
      for (const r of msg.records) { body.insertBefore(row(r), body.firstChild); newest = String(r.id); }
    };
    socket.onclose = () => { if (box.checked) { status.textContent = "reconnecting"; setTimeout(start, 2000); } };
  }
  box.addEventListener("change", () => {
    if (box.checked) start();
    else { status.textContent = ""; if (socket) { const s = socket; socket = null; s.onclose = null; s.close(); } }
  });
})();
