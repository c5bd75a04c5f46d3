// The device validation page of one node: the benchmark chart (this node beside the pool's
// median, plotly) and, while a run is open, its live progress from GET /api/validations/<id>
// every second; the page reloads when the run ends, to show the new report.
(function () {
  "use strict";
  const POLL_MS = 1000;
  const ENDED = new Set(["passed", "warned", "failed", "error"]);

  function drawChart() {
    const el = document.getElementById("bench-chart");
    const data = document.getElementById("bench-data");
    if (!el || !data || !window.Plotly) return;
    const figures = JSON.parse(data.textContent).filter(f => f.node !== null);
    if (!figures.length) return;
    const labels = figures.map(f => `${f.label} (${f.unit})`);
    const traces = [{type: "bar", name: "this node", x: labels, y: figures.map(f => f.node), marker: {color: "#2456d6"}}];
    if (figures.some(f => f.pool !== null)) {
      traces.push({type: "bar", name: "pool median", x: labels, y: figures.map(f => f.pool), marker: {color: "#8a939e"}});
    }
    Plotly.newPlot(el, traces, {barmode: "group", margin: {t: 10, r: 10, b: 60, l: 50}, yaxis: {type: "log", title: "log scale"}},
      {displayModeBar: false, responsive: true});
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
        if (ENDED.has(run.state)) { window.location.reload(); return; }
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
