// Playground: chat with the array over /ws/sessions/<id>/ (the logged-in session authenticates).
(function () {
  "use strict";
  const $ = id => document.getElementById(id);
  let socket = null, current = null, sessionId = null;

  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = "msg " + role;
    div.innerHTML = `<b>${role}</b> <span class="content"></span><div class="meta"></div>`;
    div.querySelector(".content").textContent = text || "";
    $("conversation").appendChild(div);
    div.scrollIntoView({block: "end"});
    return div;
  }
  function setStatus(text) { $("chat-status").textContent = text; }
  function connect() {
    sessionId = $("session").value.trim();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}/ws/sessions/${encodeURIComponent(sessionId)}/`);
    socket.onopen = () => setStatus(`connected to session ${sessionId}`);
    socket.onclose = () => { setStatus("disconnected"); socket = null; $("send").disabled = false; };
    socket.onmessage = (e) => {
      const msg = JSON.parse(e.data);
      if (msg.type === "delta" && current) current.querySelector(".content").textContent += msg.content;
      else if (msg.type === "done" && current) {
        const t = msg.timings || {}, u = msg.usage || {};
        const bits = [msg.package ? `${msg.package} on ${msg.node}` : `node ${msg.node}`];
        if (t.ttft_ms != null) bits.push(`TTFT ${Number(t.ttft_ms).toFixed(0)} ms`);
        if (t.decode_tokens_per_s != null) bits.push(`${Number(t.decode_tokens_per_s).toFixed(1)} tok/s`);
        if (t.prompt_tokens != null) bits.push(`prompt ${t.prompt_tokens} (cached ${t.cached_tokens || 0})`);
        if (u.completion_tokens != null) bits.push(`${u.completion_tokens} tokens`);
        if (t.total_ms != null) bits.push(`total ${Number(t.total_ms).toFixed(0)} ms`);
        if (current.dataset.sampling) bits.push(current.dataset.sampling);
        if (msg.finish_reason === "length") bits.push("cut off at max tokens");
        const meta = current.querySelector(".meta");
        meta.textContent = bits.join(" · "); meta.dataset.node = msg.node; meta.dataset.package = msg.package || ""; meta.classList.add("done");
        current = null; $("send").disabled = false; setStatus("ready");
      } else if (msg.type === "error") {
        (current || bubble("error", "")).querySelector(".content").textContent += ` [error ${msg.code}: ${msg.message}]`;
        if (current) current.classList.add("error");
        current = null; $("send").disabled = false; setStatus("error: " + msg.message);
      }
    };
    return new Promise(resolve => socket.addEventListener("open", resolve, {once: true}));
  }
  $("send-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = $("message").value.trim();
    if (!text || current) return;
    if (!socket || sessionId !== $("session").value.trim()) { if (socket) socket.close(); await connect(); }
    bubble("user", text);
    current = bubble("assistant", "");
    $("message").value = ""; $("send").disabled = true; setStatus("generating…");
    // sampling is explicit: the temperature shown, and a seed drawn per message unless one is set
    const temperature = Number.isFinite(parseFloat($("temperature").value)) ? parseFloat($("temperature").value) : 0.8;
    const seed = $("seed").value.trim() ? parseInt($("seed").value, 10) : Math.floor(Math.random() * 2147483647);
    current.dataset.sampling = `temperature ${temperature} · seed ${seed}`;
    socket.send(JSON.stringify({type: "user", content: text, model: $("model").value || undefined,
                                max_tokens: parseInt($("max-tokens").value, 10) || 64, temperature, seed}));
  });
  function boundMaxTokens() {
    // a sequence holds prompt plus output: the chosen package's per-sequence limit bounds it
    const option = $("model").selectedOptions[0];
    const limit = option && parseInt(option.dataset.limit, 10);
    if (limit) $("max-tokens").max = String(limit);
  }
  $("model").addEventListener("change", boundMaxTokens);
  boundMaxTokens();
  $("new-session").addEventListener("click", () => {
    $("session").value = "playground-" + Math.random().toString(16).slice(2, 14);
    $("conversation").innerHTML = ""; if (socket) socket.close();
  });
  $("message").addEventListener("keydown", e => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("send-form").requestSubmit(); });
})();
