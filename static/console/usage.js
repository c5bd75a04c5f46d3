// The Usage page's charts (plotly): tokens (prompt + completion) and cost over the period, one
// stacked bar per bucket (a minute up to 6 h, else an hour), per API token or per model, drawn
// from the series the page embeds (the shape GET /api/usage returns).
(function () {
  "use strict";
  const CONFIG = {displayModeBar: false, responsive: true};
  const BUCKET_MS = {minute: 60e3, hour: 3600e3};

  function embedded(id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }
  // a moment as plotly reads a date, in UTC: "YYYY-MM-DD HH:MM:SS" (plotly ignores zone suffixes)
  const utc = ms => new Date(ms).toISOString().slice(0, 19).replace("T", " ");
  const at = iso => utc(Date.parse(iso));

  function draw(id, series, field, title, period) {
    const el = document.getElementById(id);
    if (!el) return;
    const width = BUCKET_MS[period.bucket];
    const traces = series.map(s => ({
      type: "bar", name: s.name, x: s.t.map(at), y: s[field], width: s.t.map(() => width * 0.9),
      offset: 0, hovertemplate: `%{x}: %{y} ${field === "cost" ? period.currency : "tokens"}<extra>${s.name}</extra>`,
    }));
    const now = Date.now();
    const layout = {
      barmode: "stack", height: 300, margin: {l: 70, r: 10, t: 30, b: 40},
      title: {text: title, font: {size: 14}}, legend: {orientation: "h", y: -0.2},
      xaxis: {type: "date", range: [utc(now - period.hours * 3600e3), utc(now + width)]},
      yaxis: {rangemode: "tozero", exponentformat: "none", title: {text: field === "cost" ? period.currency : "tokens"}},
    };
    Plotly.react(el, traces, layout, CONFIG);
  }

  function drawAll(group) {
    const period = embedded("usage-period");
    const series = embedded(`usage-series-${group}`) || [];
    const per = group === "model" ? "model" : "API token";
    draw("usage-tokens-chart", series, "tokens", `Tokens per ${per}`, period);
    draw("usage-cost-chart", series, "cost", `Cost per ${per} (${period.currency})`, period);
    for (const button of document.querySelectorAll("#usage-group button")) {
      const on = button.dataset.group === group;
      button.classList.toggle("primary", on);
      button.setAttribute("aria-pressed", String(on));
    }
  }

  for (const button of document.querySelectorAll("#usage-group button")) {
    button.addEventListener("click", () => drawAll(button.dataset.group));
  }
  drawAll("caller");
})();
