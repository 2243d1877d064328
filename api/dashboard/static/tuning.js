// Tuning: re-plan the stored request with other options side by side, sweep budgets per backend, copy the best options.
"use strict";

(() => {
  const { api, showError, clearError, num, secs, ms, pct, el, planIdFromPath, COLOURS, chartWidth } = DHP;
  const id = planIdFromPath();
  const columns = [];   // the stored plan and each re-plan: {label, result}
  const swept = [];     // the sweep's results: {label, result}
  let best = null;
  let sweepPlot = null;
  let storedOptions = {};
  // The planner's default budget, which is also a re-plan's when the form gives none (api/dashboard/tuning.py).
  const DEFAULT_BUDGET_MS = 200;

  const ROWS = [
    ["Predicted step s", (r) => secs(r.predicted_step_time_s)],
    ["Ratio to bound", (r) => num(r.ratio_to_bound, 4)],
    ["Gap", (r) => pct(r.gap, 2)],
    ["Speedup over static", (r) => (r.static_speedup ? num(r.static_speedup, 3) + "\u00d7" : "\u2013")],
    ["Planner ms", (r) => (r.planner_ms === null ? "\u2013" : ms(r.planner_ms))],
    ["Backend \u00b7 status", (r) => r.backend + " \u00b7 " + r.solver_status],
    ["Micro-batches", (r) => String(r.micro_batches)],
    ["Groups (largest)", (r) => `${r.groups} (${r.largest_group})`],
    ["Solver note", (r) => r.fallback_reason || ""],
  ];

  function label(options) {
    const o = options || {};
    const parts = [o.backend || "auto", (o.time_budget_ms || DEFAULT_BUDGET_MS) + " ms"];
    if (o.degree_policy) parts.push(o.degree_policy);
    if (o.cp_scheme) parts.push(o.cp_scheme);
    if (o.max_micro_batches) parts.push("\u2264" + o.max_micro_batches + " mb");
    if (o.max_degree) parts.push("size \u2264" + o.max_degree);
    return parts.join(", ");
  }

  function copyText(text, status) {
    const done = () => { status.textContent = "Copied."; };
    if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, () => { status.textContent = "Select the text and copy it."; });
    else {
      const area = el("textarea", { style: "position:fixed;left:-9999px" });
      area.value = text;
      document.body.append(area);
      area.select();
      try { document.execCommand("copy"); done(); } catch (e) { status.textContent = "Select the text and copy it."; }
      area.remove();
    }
  }

  // Predicted step times within this relative distance are a tie: the cheaper plan wins it.
  const TIE = 1e-9;
  // What a plan cost to find: its budget (a re-plan's options always hold one; the stored plan's is in the view),
  // then the planner's wall time.
  function cost(r) {
    return [r.budget_ms ?? (r.options && r.options.time_budget_ms) ?? DEFAULT_BUDGET_MS,
            r.planner_ms === null || r.planner_ms === undefined ? Infinity : r.planner_ms];
  }
  // Whether plan a beats plan b: a faster predicted step, or a tie on it and a lower budget, then wall time.
  function beats(a, b) {
    const ta = a.predicted_step_time_s, tb = b.predicted_step_time_s;
    if (Math.abs(ta - tb) > TIE * Math.max(Math.abs(ta), Math.abs(tb))) return ta < tb;
    const [ba, wa] = cost(a), [bb, wb] = cost(b);
    return ba !== bb ? ba < bb : wa < wb;
  }
  function fastest(list) {
    return list.reduce((b, c) => (b === null || beats(c.result, b.result) ? c : b), null);
  }

  function renderCompare() {
    const top = fastest(columns);
    const winner = top === null ? null : columns.indexOf(top);
    best = fastest(columns.concat(swept));
    document.getElementById("best-label").textContent = best ? best.label + ": " + secs(best.result.predicted_step_time_s) + " s predicted" : "";
    const thead = document.querySelector("#compare thead");
    const tbody = document.querySelector("#compare tbody");
    thead.replaceChildren(el("tr", {}, el("th", { scope: "col", text: "Setting" }),
      ...columns.map((c, k) => el("th", { scope: "col", class: "num" + (k === winner ? " best" : "") }, c.label, k === winner ? el("div", { text: "best" }) : null))));
    const rows = ROWS.map(([name, f]) => el("tr", {}, el("th", { scope: "row", text: name }),
      ...columns.map((c, k) => el("td", { class: (name === "Solver note" ? "note" : "num") + (k === winner ? " best" : ""), text: f(c.result) }))));
    const status = document.getElementById("copy-status");
    rows.push(el("tr", {}, el("th", { scope: "row", text: "Options" }), ...columns.map((c) => el("td", { class: "num" },
      el("button", { type: "button", "aria-label": "Copy the options of " + c.label, onclick: () => copyText(JSON.stringify(c.result.options, null, 2), status), text: "Copy options" })))));
    tbody.replaceChildren(...rows);
    document.getElementById("best-options").textContent = best ? JSON.stringify(best.result.options, null, 2) : "";
  }

  async function replan(options) {
    return api(`/v1/dashboard/plans/${encodeURIComponent(id)}/replan`, { method: "POST", body: { options } });
  }

  document.getElementById("variant").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const form = ev.target;
    if (!form.reportValidity()) return;
    const options = {};
    for (const name of ["backend", "degree_policy", "cp_scheme"]) if (form.elements[name].value) options[name] = form.elements[name].value;
    for (const name of ["time_budget_ms", "max_micro_batches", "max_degree"]) {
      const v = form.elements[name].value;
      if (v !== "") options[name] = name === "time_budget_ms" ? parseFloat(v) : parseInt(v, 10);
    }
    const status = document.getElementById("variant-status");
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    status.textContent = "Planning " + label({ ...storedOptions, time_budget_ms: undefined, ...options }) + "\u2026";
    try {
      const r = await replan(options);
      columns.push({ label: label(r.options), result: r });
      renderCompare();
      status.textContent = `Re-planned with ${label(r.options)}: ${secs(r.predicted_step_time_s)} s in ${ms(r.planner_ms)} ms.`;
      clearError();
    } catch (err) { status.textContent = ""; showError(err); } finally { button.disabled = false; }
  });

  function drawSweep(budgets, backends, results) {
    const box = document.getElementById("sweep-chart");
    const data = [budgets, ...backends.map((b) => budgets.map((x) => (results[b][x] ? results[b][x].ratio_to_bound : null)))];
    // Backends often reach the same plan: earlier series are drawn wider, so a later one on top leaves them visible.
    const series = [{ label: "budget ms" }, ...backends.map((b, i) => ({ label: b, stroke: COLOURS[i % COLOURS.length], width: Math.max(1.5, 5 - 1.5 * i),
      points: { show: true, size: Math.max(5, 13 - 3 * i), fill: COLOURS[i % COLOURS.length] }, value: (u, y) => (y === null ? "\u2013" : num(y, 4)) }))];
    const ys = data.slice(1).flat().filter((y) => y !== null);
    const lo = ys.length ? Math.min(...ys) : 1, hi = ys.length ? Math.max(...ys) : 1.1;
    const pad = Math.max((hi - lo) * 0.15, 0.002);
    const opts = { width: chartWidth(box, 900), height: 280,
                   scales: { x: { time: false, distr: 3, range: [budgets[0] / 1.25, budgets[budgets.length - 1] * 1.25] }, y: { range: [lo - pad, hi + pad] } },
                   axes: [{ label: "budget (ms, log scale)", splits: () => budgets, filter: (u, splits) => splits, values: (u, vals) => vals.map((x) => (x === null ? "" : x + " ms")) },
                          { label: "predicted / lower bound", size: 70, values: (u, vals) => vals.map((y) => num(y, 4)) }], series };
    if (sweepPlot) sweepPlot.destroy();
    box.replaceChildren();
    sweepPlot = new uPlot(opts, data, box);
    box.dataset.points = String(data.slice(1).flat().filter((y) => y !== null).length);
    const thead = document.querySelector("#sweep-table thead");
    const tbody = document.querySelector("#sweep-table tbody");
    thead.replaceChildren(el("tr", {}, el("th", { scope: "col", text: "Backend" }), ...budgets.map((x) => el("th", { scope: "col", class: "num", text: x + " ms" }))));
    tbody.replaceChildren(...backends.map((b) => el("tr", {}, el("th", { scope: "row", text: b }), ...budgets.map((x) => {
      const r = results[b][x];
      return el("td", { class: "num", text: r ? (r.error ? r.error : `${num(r.ratio_to_bound, 4)} (${ms(r.planner_ms)})`) : "\u2026" });
    }))));
  }

  document.getElementById("sweep").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const form = ev.target;
    const backends = [...form.querySelectorAll("input[name=backend]:checked")].map((i) => i.value);
    const budgets = [...new Set(form.elements.budgets.value.split(/[\s,]+/).filter(Boolean).map(Number))].sort((a, b) => a - b);
    const status = document.getElementById("sweep-status");
    if (!backends.length || !budgets.length || budgets.some((b) => !(b >= 1))) {
      status.textContent = "Pick at least one backend and give budgets in ms (numbers of at least 1, separated by commas).";
      form.elements.budgets.focus();
      return;
    }
    const button = form.querySelector("button[type=submit]");
    const progress = document.getElementById("sweep-progress");
    button.disabled = true;
    document.getElementById("sweep-prompt").hidden = true;
    for (const id of ["sweep-progress", "sweep-chart", "sweep-results"]) document.getElementById(id).hidden = false;
    const results = Object.fromEntries(backends.map((b) => [b, {}]));
    const total = backends.length * budgets.length;
    progress.max = total;
    let done = 0;
    try {
      for (const x of budgets) {
        for (const b of backends) {
          status.textContent = `Planning with ${b} at ${x} ms (${done + 1} of ${total})\u2026`;
          try {
            const r = await replan({ ...storedOptions, backend: b, time_budget_ms: x });
            results[b][x] = r;
            swept.push({ label: label(r.options), result: r });
          } catch (err) {
            if (err.status === 401) throw err;
            results[b][x] = { error: err.message, ratio_to_bound: null };
          }
          done += 1;
          progress.value = done;
          drawSweep(budgets, backends, results);
        }
      }
      renderCompare();
      status.textContent = `Sweep done: ${total} plans.`;
      clearError();
    } catch (err) { showError(err); } finally { button.disabled = false; }
  });

  document.getElementById("copy-best").addEventListener("click", () => {
    if (best) copyText(JSON.stringify(best.result.options, null, 2), document.getElementById("copy-status"));
  });

  document.addEventListener("DOMContentLoaded", async () => {
    document.getElementById("plan-id").textContent = id;
    document.getElementById("plan-link").href = `/dashboard/plans/${encodeURIComponent(id)}`;
    try {
      const v = await api(`/v1/dashboard/plans/${encodeURIComponent(id)}`);
      storedOptions = v.options;
      document.getElementById("variant").elements.time_budget_ms.placeholder = String(DEFAULT_BUDGET_MS);
      if (v.status !== "done") {
        showError({ message: "This plan is " + v.status + "; its request can still be planned again below." });
        document.body.dataset.ready = "1";
        return;
      }
      const groups = v.gantt.micro_batches.flatMap((m) => m.groups);
      columns.push({ label: "stored: " + label({ ...v.options, time_budget_ms: v.budget_ms }), result: {
        options: v.options, budget_ms: v.budget_ms, predicted_step_time_s: v.predicted_step_time_s,
        ratio_to_bound: v.ratio_to_bound, gap: v.gap,
        static_speedup: v.static_baseline ? v.static_baseline.speedup : null, planner_ms: v.solver ? v.solver.wall_ms : null,
        backend: v.solver ? v.solver.backend : "?", solver_status: v.solver ? v.solver.status : "?", micro_batches: v.gantt.micro_batches.length,
        groups: groups.length, largest_group: Math.max(...groups.map((g) => g.degree)), fallback_reason: v.solver ? v.solver.fallback_reason : null } });
      renderCompare();
      document.body.dataset.ready = "1";
    } catch (err) {
      showError(err);
      document.body.dataset.ready = "error";
    }
  });
})();
