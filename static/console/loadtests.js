// The load-test page: live figures and charts (plotly) from /ws/loadtests/<id>/ while the run
// runs, then the report's throughput-against-concurrency curve with its knee (and an overlay
// of another run). A run that ends while the page is open reloads it to show the report.
(function () {
  "use strict";
  const COLOURS = ["#2456d6", "#d98a14", "#1f9d55", "#d64545", "#7a4fd6", "#0f8f9e"];
  const CONFIG = {displayModeBar: false, responsive: true};
  const STATE_COLOURS = {queued: "grey", running: "blue", succeeded: "green", stopped: "orange", failed: "red"};

  function embedded(id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }
  function text(id, value) { const el = document.getElementById(id); if (el) el.textContent = value; }
  function secs(v) { return v == null ? "—" : (v < 1 ? (v * 1000).toFixed(0) + " ms" : v.toFixed(2) + " s"); }
  function layout(title, extra) {
    // the legend sits at the foot of the figure (container coordinates), below the axis title,
    // in a margin tall enough for both: it never covers "s since start"
    return Object.assign({title: {text: title, font: {size: 13}}, height: 290, margin: {l: 50, r: 50, t: 30, b: 90},
      xaxis: {title: {text: "s since start", standoff: 6}}, yaxis: {rangemode: "tozero"},
      legend: {orientation: "h", x: 0, y: 0, yref: "container", yanchor: "bottom", font: {size: 10}}}, extra || {});
  }

  // --- live ---------------------------------------------------------------------------------
  const samples = [];  // [{t, data}]

  function series(pick) {
    return {x: samples.map(s => s.t), y: samples.map(s => { const v = pick(s.data); return v == null ? null : v; })};
  }
  function nodeIds() {
    const ids = new Set();
    samples.forEach(s => Object.keys(s.data.nodes || {}).forEach(id => ids.add(id)));
    return [...ids].sort();
  }
  function line(name, pick, extra) { return Object.assign({name, mode: "lines", type: "scatter"}, series(pick), extra || {}); }
  function perNode(field, suffix) {
    return nodeIds().map((id, i) => line(id + (suffix || ""), d => (d.nodes[id] || {})[field], {line: {color: COLOURS[i % COLOURS.length]}}));
  }
  function draw(id, traces, title, extra) {
    const el = document.getElementById(id);
    Plotly.react(el, traces, layout(title, extra), CONFIG);
    el.dataset.points = String(traces.reduce((a, t) => a + t.y.filter(v => v != null).length, 0));
  }
  function drawCharts() {
    if (!samples.length) return;
    draw("lt-chart-throughput", [line("requests/s", d => d.requests_per_s), line("tokens/s", d => d.tokens_per_s, {yaxis: "y2"}),
      line("concurrency", d => d.concurrency, {line: {dash: "dot"}})], "Throughput (10 s window)",
      {yaxis2: {overlaying: "y", side: "right", rangemode: "tozero", title: {text: "tokens/s"}}});
    draw("lt-chart-latency", [line("TTFT P50", d => d.ttft_p50_s), line("TTFT P95", d => d.ttft_p95_s),
      line("turn P95", d => d.turn_p95_s), line("session P95", d => d.session_p95_s, {yaxis: "y2"})], "Latency (s)",
      {yaxis2: {overlaying: "y", side: "right", rangemode: "tozero", title: {text: "session s"}}});
    draw("lt-chart-cpu", perNode("cpu"), "Node CPU %");
    draw("lt-chart-kv", perNode("kv_pct"), "Node KV cache use %");
    draw("lt-chart-seq", perNode("active", " active").concat(perNode("queue", " queue").map(t => Object.assign(t, {line: {dash: "dot"}}))), "Sequences and queue");
    draw("lt-chart-plane", [line("/health ms", d => d.health_ms), line("console API ms", d => d.console_ms)], "Control plane latency (ms)");
  }
  function drawLive(live) {
    if (!live || live.step == null) return;
    text("live-step", `${live.step + 1} / ${live.steps}`);
    text("live-concurrency", `${live.concurrency} (${live.open_sessions} open)`);
    text("live-rps", live.requests_per_s.toFixed(2));
    text("live-ttft", `${secs(live.ttft_p50_s)} / ${secs(live.ttft_p95_s)}`);
    text("live-turn", secs(live.turn_p95_s));
    text("live-session", secs(live.session_p95_s));
    text("live-tools", live.tool_validity == null ? "—" : (live.tool_validity * 100).toFixed(0) + " %");
    const kinds = Object.entries(live.errors || {});
    text("live-errors", String(kinds.reduce((a, [, n]) => a + n, 0)));
    text("live-error-kinds", kinds.map(([k, n]) => `${k}: ${n}`).join(" · "));
  }
  function drawRun(run) {
    const bar = document.getElementById("lt-bar");
    const pct = Math.round(run.progress * 100);
    if (bar) bar.value = pct;
    text("lt-percent", pct + "%");
    text("lt-message", run.cancel_requested && !run.finished ? "stopping…" : run.message);
    const state = document.getElementById("lt-state");
    if (state) {
      state.textContent = run.state.charAt(0).toUpperCase() + run.state.slice(1);
      state.className = "badge badge-" + (STATE_COLOURS[run.state] || "grey");
    }
    drawLive(run.live);
  }

  function follow(id, reloadAtEnd) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/loadtests/${id}/`);
    socket.onmessage = (e) => {
      const msg = JSON.parse(e.data);
      if (msg.type === "run") {
        msg.samples.forEach(s => samples.push({t: s.t, data: s.data}));
        drawRun(msg.run);
        drawCharts();
      } else if (msg.type === "finished" && reloadAtEnd) {
        reloadAtEnd = false;  // once: the reloaded page was rendered finished
        setTimeout(() => location.reload(), 500);
      }
    };
  }

  // --- report -----------------------------------------------------------------------------------
  function drawCurve(curve, overlay, target) {
    const el = document.getElementById("lt-chart-curve");
    if (!el || !curve || !curve.length) return;
    const x = curve.map(p => p.concurrency);
    const traces = [
      {x, y: curve.map(p => p.tokens_per_s), name: "tokens/s", mode: "lines+markers", line: {color: COLOURS[0]}},
      {x, y: curve.map(p => p.p95_s), name: "cache-hit TTFT P95 (s)", yaxis: "y2", mode: "lines+markers", line: {color: COLOURS[1], dash: "dot"}},
    ];
    if (overlay) {
      traces.push({x: overlay.curve.map(p => p.concurrency), y: overlay.curve.map(p => p.tokens_per_s), name: `run ${overlay.id} tokens/s`, mode: "lines+markers", line: {color: COLOURS[2]}});
      traces.push({x: overlay.curve.map(p => p.concurrency), y: overlay.curve.map(p => p.p95_s), name: `run ${overlay.id} P95 (s)`, yaxis: "y2", mode: "lines+markers", line: {color: COLOURS[3], dash: "dot"}});
    }
    let knee = null;  // as the server finds it: the leading run of steps that meet the target
    for (const p of [...curve].sort((a, b) => a.concurrency - b.concurrency)) { if (!p.meets) break; knee = p.concurrency; }
    const shapes = [{type: "line", xref: "paper", x0: 0, x1: 1, yref: "y2", y0: target, y1: target, line: {color: COLOURS[3], width: 1, dash: "dash"}}];
    const annotations = [];
    if (knee != null) {
      shapes.push({type: "line", x0: knee, x1: knee, yref: "paper", y0: 0, y1: 1, line: {color: COLOURS[2], width: 2}});
      annotations.push({x: knee, yref: "paper", y: 1, text: `knee: ${knee} sessions`, showarrow: false, yanchor: "bottom"});
    }
    Plotly.react(el, traces, {height: 340, margin: {l: 55, r: 60, t: 30, b: 45}, legend: {orientation: "h", y: -0.25},
      xaxis: {title: {text: "concurrent sessions"}, type: "log", tickvals: x}, yaxis: {title: {text: "tokens/s"}, rangemode: "tozero"},
      yaxis2: {title: {text: "P95 s (dashed: target)"}, overlaying: "y", side: "right", rangemode: "tozero", tickformat: ".2f"}, shapes, annotations}, CONFIG);
    el.dataset.points = String(traces.reduce((a, t) => a + t.y.filter(v => v != null).length, 0));
    el.dataset.knee = knee == null ? "" : String(knee);
  }

  function bind(id) {
    const data = embedded("lt-data");
    if (!data) return;
    drawRun(data);
    drawCurve(embedded("lt-curve"), embedded("lt-overlay"), data.scenario.target_p95_s || 0.3);
    follow(id, !data.finished);
  }
  window.PhalanxLoadTests = {bind};
})();
