// The package pages: job rows kept live (GET /api/packages/jobs/<id> once a second while a job
// is queued or running; everything else comes from the page, so a reload shows the same), the
// Cancel button (POST /api/packages/jobs/<id>/cancel), the browser upload (in parts through
// /api/packages/uploads, with its progress) and the family chart (plotly,
// from the points the page embeds with json_script).
(function () {
  "use strict";
  const ACTIVE = new Set(["queued", "running"]);
  const POLL_MS = 1000;
  // ModelPackage.STATUS_COLOURS / PackageJob.STATE_COLOURS names -> the stylesheet's colours
  const COLOURS = {green: "#1f9d55", red: "#d64545", orange: "#d98a14", grey: "#8a939e", blue: "#2456d6"};

  function csrf() {
    const field = document.querySelector("[name=csrfmiddlewaretoken]");
    return field ? field.value : "";
  }
  function embedded(id, fallback) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : fallback;
  }
  function field(row, name) { return row.querySelector(`[data-field="${name}"]`); }

  // --- jobs ------------------------------------------------------------------------------------

  function applyJob(job, colours) {
    const percent = Math.round((job.progress || 0) * 100);
    document.querySelectorAll(`tr[data-job="${job.id}"]`).forEach(row => {
      const was = row.dataset.state;
      row.dataset.state = job.state;
      const badge = field(row, "state");
      badge.textContent = job.state;
      badge.className = "badge badge-" + (colours[job.state] || "grey");
      field(row, "bar").value = percent;
      field(row, "percent").textContent = percent + "%";
      const message = field(row, "message");
      if (!message.dataset.pinned) message.textContent = job.message || "";
      field(row, "error").textContent = job.error || "";
      if (!ACTIVE.has(job.state)) {
        row.querySelectorAll("[data-action=cancel-job]").forEach(b => b.remove());
        if (ACTIVE.has(was)) made(row, job);
      }
    });
    const log = document.querySelector(`[data-log-job="${job.id}"]`);
    if (log && job.log != null) log.textContent = job.log || (ACTIVE.has(job.state) ? `(no lines yet: ${job.message || job.state})` : "(no lines)");
  }

  // A job that just ended links to what it made: the new version, or the package it evaluated.
  function made(row, job) {
    if (job.state !== "succeeded" || row.querySelector("[data-field=made]")) return;
    const link = document.createElement("a");
    link.dataset.field = "made";
    if (job.output_id) {
      link.href = `/packages/${job.output_id}/`;
      link.textContent = ` made ${job.output_key}`;
    } else if (job.package_id) {
      link.href = `/packages/${job.package_id}/#evaluation`;
      link.textContent = " see its results";
    } else return;
    field(row, "message").after(link);
  }

  function bindJobs() {
    const colours = embedded("job-colours", {});
    let timer = null;

    async function poll() {
      timer = null;
      const ids = new Set([...document.querySelectorAll("tr[data-job]")]
        .filter(row => ACTIVE.has(row.dataset.state)).map(row => row.dataset.job));
      for (const id of ids) {
        try {
          const answer = await fetch(`/api/packages/jobs/${id}`, {headers: {Accept: "application/json"}});
          if (answer.ok) applyJob(await answer.json(), colours);
        } catch (e) { /* the control plane is restarting: the next poll tries again */ }
      }
      if (ids.size) timer = setTimeout(poll, POLL_MS);
    }

    document.addEventListener("click", async (event) => {
      const button = event.target.closest("[data-action=cancel-job]");
      if (!button) return;
      const row = button.closest("tr[data-job]");
      button.disabled = true;
      const answer = await fetch(`/api/packages/jobs/${button.dataset.jobId}/cancel`, {
        method: "POST", headers: {"X-CSRFToken": csrf(), Accept: "application/json"},
      });
      const body = await answer.json().catch(() => ({}));
      if (answer.ok) {
        applyJob(body, colours);
        if (ACTIVE.has(body.state)) {  // running: the control loop stops its process
          const message = field(row, "message");
          message.textContent = "cancel requested";
          message.dataset.pinned = "1";
          button.remove();
        }
      } else {
        field(row, "error").textContent = body.detail || `Cancel failed (HTTP ${answer.status}).`;
        button.disabled = false;
      }
      if (!timer) poll();
    });
    poll();
  }

  // --- upload ----------------------------------------------------------------------------------

  function slug(filename) {
    return filename.replace(/\.gguf$/i, "").toLowerCase().replace(/[^a-z0-9_-]+/g, "-").replace(/^-+|-+$/g, "");
  }
  function mib(bytes) { return (bytes / 1048576).toFixed(1); }

  function bindUpload() {
    const form = document.getElementById("upload-form");
    if (!form) return;
    const file = form.querySelector("input[type=file]");
    const name = form.querySelector("input[name$=name]");
    const version = form.querySelector("input[name$=version]");
    const progress = document.getElementById("upload-progress");
    const status = document.getElementById("upload-status");
    const error = document.getElementById("upload-error");
    const button = document.getElementById("upload-button");

    function fail(text) {
      error.textContent = text; error.hidden = false;
      status.textContent = ""; progress.hidden = true; button.disabled = false;
    }
    file.addEventListener("change", () => {
      if (file.files[0] && !name.value) name.value = slug(file.files[0].name);
    });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const chosen = file.files[0];
      if (!chosen) { fail("Choose a GGUF file."); return; }
      error.hidden = true; button.disabled = true;
      progress.hidden = false; progress.value = 0;
      try {
        const url = await uploadInParts(form.dataset.url, chosen, {
          name: name.value.trim(), version: version.value.trim() || null, filename: chosen.name,
        }, (sent) => {
          const share = chosen.size ? sent / chosen.size : 1;
          progress.value = Math.round(share * 100);
          status.textContent = `${mib(sent)} of ${mib(chosen.size)} MiB sent (${Math.round(share * 100)}%)`;
        }, () => { status.textContent = "Sent; storing and reading the GGUF…"; });
        location.href = url;
      } catch (problem) {
        fail(problem.message);
      }
    });
  }

  // The parts protocol of inference/packages/uploads.py: announce, PUT parts in order (resume
  // from the server's count after an interruption, three tries a part), finish.
  async function api(method, url, body, type) {
    let answer;
    try {
      answer = await fetch(url, {
        method, body, credentials: "same-origin",
        headers: {"X-CSRFToken": csrf(), "Content-Type": type || "application/json"},
      });
    } catch (e) {
      return {status: 0, body: {}};
    }
    let parsed = {};
    try { parsed = await answer.json(); } catch (e) { /* not JSON: the status says it */ }
    return {status: answer.status, body: parsed};
  }

  function refused(answer, what) {
    return new Error(answer.body.detail || (answer.status
      ? `${what} failed (HTTP ${answer.status}).` : `${what} was interrupted.`));
  }

  const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

  async function uploadInParts(base, chosen, meta, onProgress, onSent) {
    const begun = await api("POST", base, JSON.stringify({...meta, size: chosen.size}));
    if (begun.status !== 201) throw refused(begun, "The upload");
    const upload = begun.body;
    try {
      await sendParts(`${base}/${upload.id}`, chosen, upload.part_bytes, onProgress);
    } catch (problem) {
      api("DELETE", `${base}/${upload.id}`);  // what arrived is of no use now
      throw problem;
    }
    onSent();
    const done = await api("POST", `${base}/${upload.id}/finish`);
    if (done.status !== 200 && done.status !== 201) throw refused(done, "Storing the upload");
    return `/packages/${done.body.id}/`;
  }

  // Each part in order; after an interruption or a 5xx, ask the server how much arrived and
  // go on from there, waiting 1, 2, 4, 8 s between tries (five tries, then give up).
  async function sendParts(url, chosen, partBytes, onProgress) {
    let offset = 0, tries = 0;
    while (offset < chosen.size) {
      const part = chosen.slice(offset, offset + partBytes);
      const sent = await api("PUT", `${url}?offset=${offset}`, part, "application/octet-stream");
      if (sent.status === 200) { offset = sent.body.received; tries = 0; onProgress(offset); continue; }
      const resumable = sent.status === 0 || sent.status === 409 || sent.status >= 500;
      if (!resumable || ++tries > 5) throw refused(sent, "The upload");
      await sleep(1000 * 2 ** (tries - 1));
      const where = await api("GET", url);
      if (where.status === 200) offset = where.body.received;
      else if (where.status !== 0 && where.status < 500) throw refused(where, "The upload");
    }
  }

  // --- the family chart ------------------------------------------------------------------------

  function drawFamilyChart(chartId, dataId) {
    const el = document.getElementById(chartId);
    const points = embedded(dataId, []);
    if (!el || !points.length) return;
    const fastest = Math.max(1, ...points.map(p => p.decode_tok_s || 0));
    const trace = {
      type: "scatter",
      mode: "markers+text",
      x: points.map(p => p.size_mib),
      y: points.map(p => p.tool_accuracy * 100),
      text: points.map(p => p.key),
      textposition: "top center",
      customdata: points.map(p => [p.quantization || "?", p.status,
        p.decode_tok_s == null ? "not measured" : p.decode_tok_s.toFixed(1) + " tok/s"]),
      hovertemplate: "<b>%{text}</b><br>%{customdata[0]}, %{x:.1f} MiB<br>tool accuracy %{y:.1f}%"
        + "<br>decode %{customdata[2]}<br>%{customdata[1]}<extra></extra>",
      marker: {
        size: points.map(p => p.decode_tok_s ? 10 + 22 * p.decode_tok_s / fastest : 10),
        color: points.map(p => COLOURS[p.colour] || COLOURS.grey),
        opacity: 0.85,
        line: {width: points.map(p => p.current ? 3 : 1), color: "#141a22"},
      },
    };
    const layout = {
      title: {text: "Tool accuracy (grammar) by file size; marker size: decode tok/s", font: {size: 13}},
      height: 380, margin: {l: 55, r: 20, t: 40, b: 50},
      xaxis: {title: {text: "file size (MiB)"}, rangemode: "tozero"},
      yaxis: {title: {text: "tool accuracy with grammar (%)"}, range: [0, 105]},
      showlegend: false,
    };
    Plotly.newPlot(el, [trace], layout, {displayModeBar: false, responsive: true});
    el.dataset.points = String(points.length);
    el.on("plotly_click", (data) => {
      const point = data.points && data.points[0];
      if (point) location.href = `/packages/${points[point.pointIndex].id}/`;
    });
  }

  window.PhalanxPackages = {bindJobs, bindUpload, drawFamilyChart};
})();
