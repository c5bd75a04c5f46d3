// The device validation page of one node: the benchmark chart (this node beside the pool's
// median, plotly) and, while a run is open, its live progress from GET /api/validations/<id>
// every second; the page reloads when the run ends, to show the new report.
(function () {
  "use strict";
  const POLL_MS = 1000;
  const FINISHED = new Set(["passed", "warned", "failed", "error"]);

  // One axis per unit (GB/s beside tok/s on one axis made neither readable): the figures of
  // each unit side by side on their own x and y axes, each y axis titled with its unit.
  const UNIT_TITLES = {"GB/s": "memory bandwidth, GB/s", "tok/s": "tokens/s (log scale)"};
  function drawChart() {
    const el = document.getElementById("bench-chart");
    const data = document.getElementById("bench-data");
    if (!el || !data || !window.Plotly) return;
    const figures = JSON.parse(data.textContent).filter(f => f.node !== null);
    if (!figures.length) return;
    const units = [...new Set(figures.map(f => f.unit))];
    const withPool = figures.some(f => f.pool !== null);
    const traces = [], layout = {barmode: "group", margin: {t: 10, r: 10, b: 60, l: 60}, showlegend: true};
    let from = 0;
    units.forEach((unit, i) => {
      const mine = figures.filter(f => f.unit === unit);
      const width = mine.length / figures.length, gap = units.length > 1 ? 0.08 : 0;
      const suffix = i === 0 ? "" : String(i + 1);
      const labels = mine.map(f => f.label);
      const axes = {xaxis: "x" + suffix, yaxis: "y" + suffix};
      traces.push({type: "bar", name: "this node", legendgroup: "node", showlegend: i === 0, x: labels, y: mine.map(f => f.node), marker: {color: "#2456d6"}, ...axes});
      if (withPool) traces.push({type: "bar", name: "pool median", legendgroup: "pool", showlegend: i === 0, x: labels, y: mine.map(f => f.pool), marker: {color: "#8a939e"}, ...axes});
      layout["xaxis" + suffix] = {domain: [from + (i ? gap : 0), Math.min(1, from + width)], anchor: "y" + suffix};
      layout["yaxis" + suffix] = {anchor: "x" + suffix, title: {text: UNIT_TITLES[unit] || unit}, type: unit === "tok/s" ? "log" : "linear", dtick: unit === "tok/s" ? 1 : undefined};
      from += width;
    });
    Plotly.newPlot(el, traces, layout, {displayModeBar: false, responsive: true});
  }

  function showProgress(run) {
    document.getElementById("run-progress").hidden = false;
    document.getElementById("run-bar").value = Math.round(run.progress * 100);
    document.getElementById("run-phase").textContent =
      `Run ${run.id}: ${run.state}${run.phase ? " · " + run.phase : ""} (${Math.round(run.progress * 100)}%)`;
  }

  async function follow(runId) {
    try {
      const response = await fetch(`/api/validations/${runId}`, {credentials: "same-origin"});
      if (response.ok) {
        const run = await response.json();
        showProgress(run);
        if (FINISHED.has(run.state)) { window.location.reload(); return; }
      }
    } catch (err) { /* the next poll tries again */ }
    setTimeout(() => follow(runId), POLL_MS);
  }

  window.PhalanxValidation = {
    bind(openRunId) {
      drawChart();
      if (openRunId !== null) follow(openRunId);
    },
  };
})();
