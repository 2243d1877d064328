// Calibration: measured against predicted step times (scatter with y = x), the error's distribution, per profile and
// cluster, and the refit of a cluster and model's profile from their measured group times (stored on request).
"use strict";

(() => {
  const { api, showError, clearError, num, secs, pct, el, COLOURS, chartWidth } = DHP;
  const form = document.getElementById("filters");
  const plots = [];

  // A profile's name (a zoo preset's, or a short form of its source; GET /v1/dashboard/facets) by its label.
  const names = {};
  function nameOf(label) { return names[label] || label; }
  function groupName(g) { return g.profile_name + " \u00b7 " + (g.cluster || "?"); }

  function renderCards(c) {
    const o = c.overall;
    const items = o ? [["Steps with feedback", `${c.total}`, c.total > c.points.length ? `the scatter shows the newest ${c.points.length}` : null],
                       ["Median measured / predicted", num(o.median_ratio, 3), null], ["Mean |error|", pct(o.mean_abs_error), `p90 ${pct(o.p90_abs_error)}`],
                       ["Groups to re-profile", String(c.groups.filter((g) => g.verdict === "re-profile").length), `of ${c.groups.length} profile \u00d7 cluster group(s)`]]
                    : [["Steps with feedback", "0", "trainers send it with POST /v1/plans/{id}/feedback"]];
    document.getElementById("cards").replaceChildren(...items.map(([a, b, n]) => el("div", { class: "card" }, el("dt", { text: a }),
      el("dd", {}, b, n ? el("small", { text: n }) : null))));
  }

  function renderScatter(c) {
    const box = document.getElementById("scatter");
    const pts = [...c.points].sort((a, b) => a.predicted_step_time_s - b.predicted_step_time_s);
    box.dataset.points = String(pts.length);
    if (!pts.length) { box.textContent = "No feedback matches these filters."; return; }
    const keys = [...new Set(pts.map((p) => p.group))].sort((a, b) => a - b);
    const xs = pts.map((p) => p.predicted_step_time_s);
    const lo = Math.min(...xs, ...pts.map((p) => p.measured_step_time_s));
    const hi = Math.max(...xs, ...pts.map((p) => p.measured_step_time_s));
    const pad = (hi - lo) * 0.06 || hi * 0.05;
    // The y = x line runs across the whole plot: two end points with no measurement of their own.
    const ends = [lo - pad, hi + pad];
    const data = [[ends[0], ...xs, ends[1]], [ends[0], ...xs, ends[1]],
                  ...keys.map((k) => [null, ...pts.map((p) => (p.group === k ? p.measured_step_time_s : null)), null])];
    const series = [{ label: "predicted s", value: (u, x) => secs(x) },
      { label: "y = x", stroke: "#57606a", width: 1, dash: [5, 4], points: { show: false }, value: (u, y) => secs(y) },
      ...keys.map((k, i) => ({ label: groupName(c.groups[k]), stroke: COLOURS[i % COLOURS.length],
                               paths: () => null, spanGaps: false,
                               points: { show: true, size: 7, fill: COLOURS[i % COLOURS.length], stroke: COLOURS[i % COLOURS.length] }, value: (u, y) => secs(y) }))];
    const opts = { width: chartWidth(box, 760), height: 340, series, legend: { live: true },
                   scales: { x: { time: false, range: [lo - pad, hi + pad] }, y: { range: [lo - pad, hi + pad] } },
                   axes: [{ label: "predicted step time (s)" }, { label: "measured step time (s)", size: 60 }] };
    box.setAttribute("aria-label", `Scatter of the ${pts.length} newest measured against predicted step times in ${keys.length} group(s), with the line y = x`);
    box.replaceChildren();
    plots.push(new uPlot(opts, data, box));
  }

  function renderHistogram(c) {
    const box = document.getElementById("hist");
    const { edges, counts } = c.histogram;
    const centres = counts.map((_, k) => 100 * (edges[k] + edges[k + 1]) / 2);
    box.dataset.bins = String(counts.filter((n) => n > 0).length);
    box.setAttribute("aria-label", "Histogram of measured / predicted - 1 in 5% bins: " +
      counts.map((n, k) => (n ? `${(100 * edges[k]).toFixed(0)} to ${(100 * edges[k + 1]).toFixed(0)}%: ${n}` : null)).filter(Boolean).join("; "));
    const opts = { width: chartWidth(box, 760), height: 340, scales: { x: { time: false, range: [-52, 52] }, y: { range: (u, a, b) => [0, Math.max(1, b) * 1.1] } },
                   axes: [{ label: "measured / predicted \u2212 1 (%); the outer bins hold everything beyond \u00b150%" }, { label: "steps", size: 50 }],
                   series: [{ label: "error %", value: (u, x) => (x === null ? "\u2013" : x.toFixed(1) + "%") },
                            { label: "steps", stroke: COLOURS[0], fill: COLOURS[0] + "99", paths: uPlot.paths.bars({ size: [0.9, 60] }), points: { show: false } }] };
    box.replaceChildren();
    plots.push(new uPlot(opts, [centres, counts], box));
  }

  function renderGroups(c) {
    const tbody = document.querySelector("#groups tbody");
    if (!c.groups.length) { tbody.replaceChildren(el("tr", {}, el("td", { colspan: 7, text: "No feedback yet." }))); return; }
    tbody.replaceChildren(...c.groups.map((g) => el("tr", {}, el("td", { title: g.profile, text: g.profile_name }),
      el("td", { text: g.cluster || "\u2013" }), el("td", { class: "num", text: g.n }), el("td", { class: "num", text: num(g.median_ratio, 3) }),
      el("td", { class: "num", text: pct(g.mean_abs_error) }), el("td", { class: "num", text: pct(g.p90_abs_error) }),
      el("td", { class: "verdict-" + g.verdict, text: g.verdict }))));
  }

  // -- the refit: suggested profile, its terms beside the current ones, per-group scatter, and the store button --
  const button = document.getElementById("fit-store");
  let selection = null;  // what "Fit and store" posts: the suggestion's cluster, model, profile and steps
  let refitPlot = null;  // the per-group scatter: its own, so that a reload of the charts above leaves it alone
  // Each change of the filters starts a load; an answer that arrives after a newer load began is dropped, so that
  // two quick changes never leave the older selection's charts (or its enabled button) on the page.
  let generation = 0;

  function sci(v) { return v === null || v === undefined ? "\u2013" : Number(v).toExponential(3); }

  function renderRefitCards(s) {
    const h = s.fit.held_out;
    const row = (label, key) => {
      const b = h.before && h.before[key], a = h.after && h.after[key];
      return [label, a ? pct(a.mean) : "\u2013", b && a ? `was ${pct(b.mean)}; worst ${pct(b.worst)} \u2192 ${pct(a.worst)}` : "no held-out steps"];
    };
    const items = [["Fitted steps", String(s.fit.plans - s.fit.held_out_plans), `${s.fit.points} group times, ${s.fit.held_out_plans} step(s) held out, ${s.fit.stragglers} straggler(s) dropped`],
                   row("Held-out group error", "groups"), row("Held-out micro-batch error", "micro_batches"), row("Held-out step error", "steps")];
    document.getElementById("refit-cards").replaceChildren(...items.map(([a, b, n]) => el("div", { class: "card" }, el("dt", { text: a }),
      el("dd", {}, b, n ? el("small", { text: n }) : null))));
  }

  function renderTerms(s) {
    const rows = Object.entries(s.fit.terms).map(([name, t]) => el("tr", {}, el("td", { text: name.replaceAll("_", " ") }),
      el("td", { class: "num", text: t.base === null ? "by size" : sci(t.base), title: t.base === null ? "a table by group size" : null }),
      el("td", { class: "num", text: sci(t.value) }), el("td", { class: "note", text: t.reason || (t.fitted ? "fitted" : "") })));
    rows.push(el("tr", {}, el("td", { text: "step constant" }), el("td", { class: "num", text: sci(s.fit.base_step_constant_s) }),
      el("td", { class: "num", text: sci(s.fit.step_constant_s) }), el("td", { class: "note", text: "what a step took beyond its micro-batches' slowest groups (median)" })));
    document.querySelector("#terms tbody").replaceChildren(...rows);
  }

  function renderGroupScatter(s) {
    const box = document.getElementById("group-scatter");
    const pts = [];
    for (const p of s.fit.predictions) { pts.push([p.before_s, 0, p.measured_s]); pts.push([p.after_s, 1, p.measured_s]); }
    pts.sort((a, b) => a[0] - b[0]);
    box.dataset.points = String(s.fit.predictions.length);
    const all = pts.flatMap((p) => [p[0], p[2]]);
    const lo = Math.min(...all), hi = Math.max(...all), pad = (hi - lo) * 0.06 || hi * 0.05;
    const ends = [lo - pad, hi + pad];
    const xs = pts.map((p) => p[0]);
    const data = [[ends[0], ...xs, ends[1]], [ends[0], ...xs, ends[1]],
                  [null, ...pts.map((p) => (p[1] === 0 ? p[2] : null)), null], [null, ...pts.map((p) => (p[1] === 1 ? p[2] : null)), null]];
    const dot = (c) => ({ show: true, size: 6, fill: c, stroke: c });
    const series = [{ label: "predicted s", value: (u, x) => secs(x) },
      { label: "y = x", stroke: "#57606a", width: 1, dash: [5, 4], points: { show: false }, value: (u, y) => secs(y) },
      { label: "current (" + s.profile_name + ")", stroke: COLOURS[1], paths: () => null, points: dot(COLOURS[1]), value: (u, y) => secs(y) },
      { label: "suggested", stroke: COLOURS[0], paths: () => null, points: dot(COLOURS[0]), value: (u, y) => secs(y) }];
    const opts = { width: chartWidth(box, 760), height: 340, series, legend: { live: true },
                   scales: { x: { time: false, range: ends }, y: { range: ends } },
                   axes: [{ label: "predicted group time (s)" }, { label: "measured group time (s)", size: 60 }] };
    box.setAttribute("aria-label", `Scatter of ${s.fit.predictions.length} measured group times against their predictions by the current profile and by the suggested one, with the line y = x`);
    box.replaceChildren();
    refitPlot = new uPlot(opts, data, box);
  }

  function clearRefit() {
    button.disabled = true;
    selection = null;
    if (refitPlot) { refitPlot.destroy(); refitPlot = null; }
    delete document.getElementById("group-scatter").dataset.points;
  }

  async function loadRefit(mine) {
    const note = document.getElementById("refit-note");
    const cluster = form.elements.cluster.value, model = form.elements.model.value;
    document.getElementById("stored").textContent = "";
    for (const id of ["refit-cards", "group-scatter"]) document.getElementById(id).replaceChildren();
    document.querySelector("#terms tbody").replaceChildren();
    if (!cluster || !model) {
      note.textContent = "Choose a cluster and a model above to fit the profile their plans were made with to the group times the trainers posted.";
      return;
    }
    const q = new URLSearchParams({ cluster, model });
    if (form.elements.profile.value) q.set("profile", form.elements.profile.value);
    let s;
    try { s = await api("/v1/dashboard/calibration/suggestion?" + q); } catch (err) {
      if (mine !== generation) return;
      if (err.status !== 422) throw err;
      const p = err.problem || {};
      note.textContent = "No profile to suggest: " + (p.detail || err.message) + (p.hint ? " " + p.hint : "");
      return;
    }
    if (mine !== generation) return;
    note.textContent = `The profile ${s.profile_name} refitted to the group times of the newest ${s.steps} measured step(s) of ${model} on ${cluster}; nothing is stored until you press the button.`;
    renderRefitCards(s);
    renderTerms(s);
    renderGroupScatter(s);
    selection = { cluster, model, profile: s.profile, latest: s.steps };
    button.disabled = false;
  }

  button.addEventListener("click", async () => {
    if (!selection) return;
    button.disabled = true;
    try {
      const stored = await api("/v1/profiles/fit", { method: "POST", body: selection });
      const status = document.getElementById("stored");
      status.replaceChildren("Stored ", el("code", { text: stored.reference }), `: plans use it with "profile": "${stored.reference}".`);
      status.dataset.name = stored.name;
    } catch (err) { showError(err); button.disabled = false; }
  });

  async function load() {
    const mine = ++generation;
    clearRefit();
    const q = new URLSearchParams();
    for (const f of ["cluster", "model", "profile"]) if (form.elements[f].value) q.set(f, form.elements[f].value);
    history.replaceState(null, "", location.pathname + (q.toString() ? "?" + q : ""));
    const c = await api("/v1/dashboard/calibration?" + q);
    if (mine !== generation) return;
    while (plots.length) plots.pop().destroy();
    renderCards(c);
    renderScatter(c);
    renderHistogram(c);
    renderGroups(c);
    await loadRefit(mine);
    clearError();
  }

  form.addEventListener("submit", (ev) => { ev.preventDefault(); load().catch(showError); });
  form.addEventListener("change", () => form.requestSubmit());

  document.addEventListener("DOMContentLoaded", async () => {
    const q = new URLSearchParams(location.search);
    try {
      for (const name of ["cluster", "model", "profile"]) {
        const v = q.get(name);
        if (v) form.elements[name].append(el("option", { value: v, text: v, title: v, selected: true }));
      }
      const facets = api("/v1/dashboard/facets").catch((err) => err);  // in parallel; its error, if any, is thrown below
      await load();
      const f = await facets;
      if (f instanceof Error) throw f;
      Object.assign(names, f.profile_names);
      for (const name of ["cluster", "model", "profile"]) {
        const select = form.elements[name];
        const text = (v) => (name === "profile" ? nameOf(v) : v);
        for (const option of select.options) if (option.value) option.textContent = text(option.value);
        for (const v of f[name]) {
          if (v !== q.get(name)) select.append(el("option", { value: v, text: text(v), title: v }));
        }
      }
      document.body.dataset.ready = "1";
    } catch (err) { showError(err); document.body.dataset.ready = "error"; }
  });
})();
