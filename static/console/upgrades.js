// The upgrade page, kept live: the node timeline, gates, event log and the traffic split
// (plotly) are drawn from the data the page embeds, then from GET /api/upgrades/<id>,
// .../samples and .../events every two seconds until the upgrade has finished.
(function () {
  "use strict";
  const POLL_MS = 2000;
  const FINISHED = new Set(["succeeded", "rolled_back", "failed"]);
  const VERDICTS = {pass: "✓ pass", fail: "✗ fail", skipped: "– skipped"};
  const COLOURS = {green: "#1f9d55", red: "#d64545", orange: "#d98a14", grey: "#8a939e", blue: "#2456d6"};

  function embedded(id, fallback) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : fallback;
  }
  const when = Phalanx.when;  // one time format on every page (live.js)
  function cell(text, cls) {
    const td = document.createElement("td");
    td.textContent = text == null ? "" : String(text);
    if (cls) td.className = cls;
    return td;
  }
  function fill(tableId, rows) {
    const body = document.querySelector(`#${tableId} tbody`);
    body.replaceChildren(...rows.map(cells => {
      const tr = document.createElement("tr");
      tr.append(...cells);
      return tr;
    }));
  }

  function drawUpgrade(u, colours) {
    const state = document.getElementById("upgrade-state");
    state.textContent = u.state.replace("_", " ");
    state.className = "badge badge-" + (colours[u.state] || "grey");
    document.getElementById("upgrade-phase").textContent = u.phase;
    document.getElementById("upgrade-share").textContent = (u.new_share * 100).toFixed(0) + "%";
    document.getElementById("upgrade-reason").textContent = u.reason;
    fill("upgrade-nodes", u.nodes.map(s => {
      const tr = [cell(s.node_id), cell(s.batch + 1), cell(s.state + (s.revert ? ` (${s.revert})` : "")), cell(when(s.since)), cell(s.detail, "small")];
      tr[2].dataset.node = s.node_id;
      return tr;
    }));
    fill("upgrade-gates", u.gates.map(g => {
      const verdict = g.verdict || (g.passed ? "pass" : "fail");
      return [cell(when(g.at)), cell(g.node_id || "array"), cell(g.gate),
        cell(VERDICTS[verdict] || verdict, verdict), cell(g.detail, "small")];
    }));
    showActions(u.state);
  }

  // only the actions the upgrade's state allows: Pause while it runs, Resume while paused
  function showActions(state) {
    const actions = document.getElementById("upgrade-actions");
    if (!actions) return;
    actions.hidden = FINISHED.has(state);
    for (const form of actions.querySelectorAll("form[data-show-when]")) {
      form.hidden = !form.dataset.showWhen.split(" ").includes(state);
    }
  }

  function drawEvents(events) {
    fill("upgrade-events", events.map(e => [cell(when(e.at)), cell(e.node_id), cell(e.kind), cell(e.message)]));
  }

  function drawSamples(samples) {
    const el = document.getElementById("traffic-chart");
    if (!samples.length) return;
    const x = samples.map(s => s.at);
    const traces = [
      {x, y: samples.map(s => s.old_sessions), name: "old version", mode: "lines", line: {color: COLOURS.grey}, stackgroup: "s"},
      {x, y: samples.map(s => s.new_sessions), name: "new version", mode: "lines", line: {color: COLOURS.blue}, stackgroup: "s"},
      {x, y: samples.map(s => s.new_share * 100), name: "share of new sessions to new (%)", yaxis: "y2", mode: "lines", line: {color: COLOURS.orange, dash: "dot"}},
    ];
    const layout = {
      margin: {l: 50, r: 50, t: 10, b: 40}, height: 320, legend: {orientation: "h"},
      yaxis: {title: {text: "sessions (last minute)"}, rangemode: "tozero"},
      // the share's axis at round percentages, whatever the sessions' axis does
      yaxis2: {title: {text: "share of new sessions"}, overlaying: "y", side: "right", range: [0, 105],
        tickmode: "array", tickvals: [0, 25, 50, 75, 100], ticktext: ["0 %", "25 %", "50 %", "75 %", "100 %"],
        showgrid: false},
    };
    Plotly.react(el, traces, layout, {displayModeBar: false, responsive: true});
    el.dataset.points = String(samples.length);
    document.getElementById("traffic-empty").hidden = true;
  }

  async function getJson(url) {
    const answer = await fetch(url, {credentials: "same-origin"});
    if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
    return answer.json();
  }

  function bind(id) {
    const colours = embedded("upgrade-colours", {});
    let u = embedded("upgrade-data", null);
    if (!u) return;
    drawUpgrade(u, colours);
    drawEvents(embedded("upgrade-events-data", []));
    drawSamples(embedded("upgrade-samples", []));
    async function poll() {
      try {
        const [fresh, samples, events] = await Promise.all([
          getJson(`/api/upgrades/${id}`), getJson(`/api/upgrades/${id}/samples`), getJson(`/api/upgrades/${id}/events`)]);
        u = fresh;
        drawUpgrade(u, colours); drawSamples(samples); drawEvents(events);
      } catch (e) { /* the next poll tries again */ }
      if (!FINISHED.has(u.state)) setTimeout(poll, POLL_MS);
    }
    if (!FINISHED.has(u.state)) setTimeout(poll, POLL_MS);
  }

  window.PhalanxUpgrades = {bind};
})();
