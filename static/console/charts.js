// Live plotly charts fed by the console's live feed (history first, then one snapshot a second).
(function () {
  "use strict";
  const WINDOW = 300;  // points kept per trace (5 minutes at 1 Hz)
  const MIB = 1 / 1048576;
  const CHARTS = [
    {id: "cpu", title: "CPU % (node process)", series: [["cpu", ""]]},
    {id: "mem", title: "Memory RSS (MiB)", series: [["rss", "", MIB]]},
    {id: "tps", title: "Tokens/s (whole node, 10 s average)", series: [["prefill_tps", " prefill"], ["decode_tps", " decode"]]},
    {id: "seq", title: "Sequences", series: [["active", " active"], ["idle", " idle"], ["host", " host RAM"]]},
    {id: "kv", title: "KV cache use %", series: [["kv_pct", ""]]},
    {id: "queue", title: "Queue depth", series: [["queue", ""]]},
  ];
  const HOST = {id: "host", title: "Control-plane host", series: [["cpu", "CPU %"], ["mem", "memory %"]]};

  function mount(container, nodeFilter, options) {
    options = options || {};
    const charts = (options.host ? [HOST] : []).concat(CHARTS);
    const traces = {};  // chart id -> Map(trace name -> {x, y})
    charts.forEach(c => {
      const div = document.createElement("div");
      div.className = "chart"; div.id = "chart-" + c.id; div.dataset.points = "0";
      container.appendChild(div);
      traces[c.id] = new Map();
      Plotly.newPlot(div, [], layout(c.title), {displayModeBar: false, responsive: true});
    });
    let last = -Infinity, pending = false, revision = 0;

    function push(chartId, name, x, y) {
      let t = traces[chartId].get(name);
      if (!t) { t = {x: [], y: []}; traces[chartId].set(name, t); }
      t.x.push(x); t.y.push(y);
      if (t.x.length > WINDOW) { t.x.shift(); t.y.shift(); }
    }
    function add(snap) {
      if (snap.t <= last) return;  // by time: history mixes the control loop's and live samples
      last = snap.t;
      const x = new Date(snap.t * 1000);
      if (options.host) HOST.series.forEach(([f, label]) => push("host", label, x, snap.host[f]));
      for (const [id, n] of Object.entries(snap.nodes)) {
        if (nodeFilter && id !== nodeFilter) continue;
        CHARTS.forEach(c => c.series.forEach(([f, suffix, scale]) => {
          const v = n[f] == null ? null : n[f] * (scale || 1);
          push(c.id, (nodeFilter ? "" : id) + (nodeFilter && !suffix ? f : suffix), x, v);
        }));
      }
    }
    function draw() {
      // Plotly.react redraws only what it sees change: hand it new arrays (copies of the
      // windows) and a new datarevision, or it keeps drawing the first frame
      pending = false;
      revision += 1;
      charts.forEach(c => {
        const div = document.getElementById("chart-" + c.id);
        const data = [...traces[c.id].entries()].map(([name, t]) => ({x: t.x.slice(), y: t.y.slice(), name: name.trim(), mode: "lines", type: "scatter", connectgaps: false}));
        Plotly.react(div, data, {...layout(c.title), datarevision: revision});
        div.dataset.points = String(data.reduce((a, t) => a + t.x.length, 0));
      });
    }
    function schedule() { if (!pending) { pending = true; requestAnimationFrame(draw); } }
    Phalanx.live.on("history", snaps => { snaps.forEach(add); schedule(); });
    Phalanx.live.on("snapshot", snap => { add(snap); schedule(); });
  }
  function layout(title) {
    return {title: {text: title, font: {size: 13}}, height: 250, margin: {l: 45, r: 10, t: 30, b: 55},
            xaxis: {type: "date"}, yaxis: {rangemode: "tozero"}, showlegend: true,
            legend: {orientation: "h", y: -0.32, font: {size: 10}}, uirevision: title};
  }
  window.PhalanxCharts = {mount};
})();
