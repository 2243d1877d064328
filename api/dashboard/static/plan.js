// One plan: figures, the micro-batches x ranks Gantt chart, the solver's trace and phases, the static baseline,
// the communicators, per-group times and feedback.
"use strict";

(() => {
  const { api, showError, num, secs, ms, pct, when, el, planIdFromPath, COLOURS, chartWidth } = DHP;
  const SVG = "http://www.w3.org/2000/svg";

  function svg(tag, attrs = {}) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) node.setAttribute(k, v);
    return node;
  }

  function rankList(ranks) {
    const runs = [];
    for (const r of [...ranks].sort((a, b) => a - b)) {
      if (runs.length && runs[runs.length - 1][1] === r - 1) runs[runs.length - 1][1] = r;
      else runs.push([r, r]);
    }
    return runs.map(([a, b]) => (a === b ? String(a) : a + "\u2013" + b)).join(", ");
  }

  function card(label, value, note) {
    return [el("div", { class: "card" }, el("dt", { text: label }), el("dd", {}, value, note ? el("small", { text: note }) : null))];
  }

  function renderCards(v) {
    const dl = document.getElementById("cards");
    const s = v.solver || {};
    const sb = v.static_baseline || {};
    const fb = v.feedback;
    const meanMeasured = fb.length ? fb.reduce((a, f) => a + f.measured_step_time_s, 0) / fb.length : null;
    const items = [
      ["Predicted step", secs(v.predicted_step_time_s) + " s", v.scheme ? "scheme " + v.scheme : null],
      ["Lower bound", secs(v.lower_bound_s) + " s", s.bound ? "binding: " + s.bound : null],
      ["Ratio to bound", num(v.ratio_to_bound, 3), "gap " + pct(v.gap)],
      ["Speedup over static", sb.speedup ? num(sb.speedup, 2) + "\u00d7" : "\u2013", sb.degree ? `static: size ${sb.degree}, ${sb.micro_batches} micro-batch(es), ${secs(sb.predicted_step_time_s)} s` : null],
      ["Measured step", meanMeasured === null ? "\u2013" : secs(meanMeasured) + " s",
       fb.length ? `mean of ${fb.length} step(s), ${num(meanMeasured / v.predicted_step_time_s, 3)}\u00d7 predicted` : "no feedback yet"],
      ["Planner", (s.backend || "\u2013") + " \u00b7 " + (s.status || "\u2013"), s.wall_ms !== undefined ? ms(s.wall_ms) + " ms of a " + ms(v.budget_ms) + " ms budget" : null],
      ["Batch", v.n_samples + " samples", v.n_ranks + " ranks"],
      ["Cluster \u00b7 model", (v.cluster || "\u2013"), (v.model || "\u2013") + " \u00b7 profile: " + (v.profile.length > 48 ? v.profile.slice(0, 46) + "\u2026" : v.profile)],
    ];
    dl.replaceChildren(...items.flatMap(([a, b, c]) => card(a, b, c)));
  }

  // --- the Gantt chart -------------------------------------------------------------------------
  function renderGantt(v) {
    const g = v.gantt;
    const box = document.getElementById("gantt");
    const domain = g.domain_size;
    const left = 64, top = 22, bottom = 28, right = 8;
    const width = Math.max(640, Math.min(1560, box.clientWidth - 14));
    const plotW = width - left - right;
    const rh = Math.max(3, Math.min(22, 560 / domain));
    const plotH = rh * domain;
    const height = top + plotH + bottom;
    const step = g.step_s || 1;
    const x = (t) => left + (t / step) * plotW;
    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "group", "aria-labelledby": "gantt-h", "aria-describedby": "gantt-desc" });
    const blocks = [];
    const ticks = svg("g", { "aria-hidden": "true" });
    for (const mb of g.micro_batches) {
      root.append(svg("rect", { x: x(mb.start_s), y: top, width: Math.max(1, x(mb.start_s + mb.predicted_time_s) - x(mb.start_s)), height: plotH, fill: "var(--idle)" }));
      const span = x(mb.start_s + mb.predicted_time_s) - x(mb.start_s);
      if (span >= 28) {
        const label = svg("text", { x: x(mb.start_s) + 3, y: top - 7 });
        label.textContent = span >= 130 ? `micro-batch ${mb.index + 1}: ${secs(mb.predicted_time_s)} s` : span >= 60 ? `mb ${mb.index + 1}: ${secs(mb.predicted_time_s)} s` : `${mb.index + 1}`;
        root.append(label);
      }
      for (const grp of mb.groups) {
        const w = Math.max(1, (grp.predicted_time_s / step) * plotW);
        const where = grp.intra_node ? "within one node" : "spanning nodes " + grp.nodes.join(", ");
        const text = `Micro-batch ${mb.index + 1}, group ${grp.index + 1}: size ${grp.degree} (ranks ${rankList(grp.ranks)}), ${grp.samples.length} sample(s), ` +
          `predicted ${secs(grp.predicted_time_s)} s, idle ${secs(grp.idle_s)} s, ${where}` + (grp.measured_time_s !== null ? `, measured ${secs(grp.measured_time_s)} s` : "");
        const node = svg("g", { class: "block " + (grp.intra_node ? "intra" : "inter"), tabindex: blocks.length ? -1 : 0, role: "img", "aria-label": text,
                                "data-mb": mb.index, "data-group": grp.index });
        const title = svg("title");
        title.textContent = text;
        node.append(title);
        for (const [a, b] of grp.spans) {
          node.append(svg("rect", { class: "body", x: x(mb.start_s), y: top + a * rh, width: w, height: Math.max(1, (b - a) * rh) }));
        }
        if (grp.measured_time_s !== null) {  // the newest measured time of this group: a tick across its ranks, drawn over every block
          const over = grp.measured_time_s > mb.predicted_time_s;
          const xm = over ? x(mb.start_s + mb.predicted_time_s) - 2 : x(mb.start_s + grp.measured_time_s);
          for (const [a, b] of grp.spans) ticks.append(svg("line", { class: "measured" + (over ? " over" : ""), x1: xm, x2: xm, y1: top + a * rh + 1, y2: top + b * rh - 1 }));
        }
        const [a0, b0] = grp.spans[0];
        if (w > 34 && (b0 - a0) * rh >= 11) {
          const t = svg("text", { class: "label", x: x(mb.start_s) + 3, y: top + a0 * rh + Math.min((b0 - a0) * rh, 22) / 2 + 4 });
          t.textContent = w > 80 ? `${grp.degree} ranks \u00b7 ${grp.samples.length} smp` : `${grp.degree}\u00b7${grp.samples.length}`;
          node.append(t);
        }
        root.append(node);
        blocks.push({ node, mb, grp, text });
      }
      root.append(svg("line", { x1: x(mb.start_s), x2: x(mb.start_s), y1: top - 4, y2: top + plotH, stroke: "#24292f", "stroke-width": 1.5 }));
    }
    root.append(ticks);
    // Node boundaries and labels.
    g.nodes.forEach(([a, b], k) => {
      if (a > 0) root.append(svg("line", { x1: left - 6, x2: left + plotW, y1: top + a * rh, y2: top + a * rh, stroke: "#24292f", "stroke-width": 1 }));
      if ((b - a) * rh >= 11) {
        const t = svg("text", { x: 4, y: top + ((a + b) / 2) * rh + 4 });
        t.textContent = `node ${k}`;
        root.append(t);
      }
    });
    // Time axis.
    const nTicks = 6;
    const raw = step / nTicks;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const tick = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    for (let t = 0; t <= step + 1e-12; t += tick) {
      root.append(svg("line", { x1: x(t), x2: x(t), y1: top + plotH, y2: top + plotH + 4, stroke: "#57606a" }));
      const lab = svg("text", { x: x(t) - 8, y: top + plotH + 16 });
      lab.textContent = Number(t.toPrecision(3)) + " s";
      root.append(lab);
    }
    box.replaceChildren(root);
    box.dataset.blocks = String(blocks.length);

    const detail = document.getElementById("block-detail");
    const rows = document.querySelectorAll("#groups tbody tr");
    let current = 0;
    function select(k, focus) {
      blocks[current].node.setAttribute("tabindex", "-1");
      blocks[current].node.classList.remove("selected");
      rows[current] && rows[current].classList.remove("selected");
      current = (k + blocks.length) % blocks.length;
      const b = blocks[current];
      b.node.setAttribute("tabindex", "0");
      b.node.classList.add("selected");
      if (focus) b.node.focus();
      detail.textContent = b.text + ". Samples: " + b.grp.samples.join(", ");
      if (rows[current]) { rows[current].classList.add("selected"); rows[current].scrollIntoView({ block: "nearest" }); }
    }
    blocks.forEach((b, k) => {
      b.node.addEventListener("focus", () => { if (k !== current || !b.node.classList.contains("selected")) select(k, false); });
      b.node.addEventListener("click", () => select(k, true));
    });
    root.addEventListener("keydown", (ev) => {
      const moves = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };
      if (ev.key in moves) { select(current + moves[ev.key], true); ev.preventDefault(); }
      else if (ev.key === "Home") { select(0, true); ev.preventDefault(); }
      else if (ev.key === "End") { select(blocks.length - 1, true); ev.preventDefault(); }
    });
  }

  function renderGroups(v) {
    const tbody = document.querySelector("#groups tbody");
    const rows = [];
    for (const mb of v.gantt.micro_batches) {
      for (const g of mb.groups) {
        rows.push(el("tr", {}, el("td", { class: "num", text: mb.index + 1 }), el("td", { class: "num", text: g.index + 1 }),
          el("td", { text: rankList(g.ranks) }), el("td", { class: "num", text: g.degree }),
          el("td", { text: (g.nodes.join(", ") || "\u2013") + (g.intra_node ? "" : " (spans nodes)") }),
          el("td", { class: "num", text: g.samples.length, title: g.samples.join(", ") }), el("td", { class: "num", text: secs(g.predicted_time_s) }),
          el("td", { class: "num", text: g.measured_time_s === null ? "\u2013" : secs(g.measured_time_s) }), el("td", { class: "num", text: secs(g.idle_s) })));
      }
    }
    tbody.replaceChildren(...rows);
  }

  // --- the solver's trace and phases -----------------------------------------------------------
  function renderTrace(v) {
    const s = v.solver || {};
    const trace = s.trace || [];
    const box = document.getElementById("trace-chart");
    box.dataset.points = String(trace.length);
    if (!trace.length) { box.textContent = "This plan has no solver trace."; return; }
    const xs = trace.map((p) => p.elapsed_ms);
    const obj = trace.map((p) => p.objective_s);
    // A bound proven at some time holds from then on: carry the best one forward.
    let known = null;
    const bnd = trace.map((p) => (known = p.bound_s === null || p.bound_s === undefined ? known : known === null ? p.bound_s : Math.max(known, p.bound_s)));
    const all = obj.concat(bnd).filter((y) => y !== null);
    const lo = Math.min(...all), hi = Math.max(...all);
    const pad = Math.max((hi - lo) * 0.15, hi * 0.01);
    const xmax = Math.max(s.wall_ms || 0, xs[xs.length - 1]) * 1.05;
    box.setAttribute("aria-label", `Solver trace: ${trace.length} point(s); best plan ${secs(obj[obj.length - 1])} s, bound ${secs(bnd[bnd.length - 1])} s after ${ms(xs[xs.length - 1])} ms`);
    const opts = {
      width: chartWidth(box, 720), height: 260,
      scales: { x: { time: false, range: [0, xmax] }, y: { range: [lo - pad, hi + pad] } },
      axes: [{ label: "planner time (ms)" }, { label: "step time (s)", size: 60 }],
      series: [{ label: "ms" },
        { label: "best plan", stroke: COLOURS[0], width: 2, points: { show: true, size: 8, fill: COLOURS[0] }, value: (u, y) => secs(y) },
        { label: "lower bound (best so far)", stroke: COLOURS[1], width: 2, dash: [6, 4], points: { show: true, size: 8, fill: COLOURS[1] }, value: (u, y) => secs(y) }],
    };
    new uPlot(opts, [xs, obj, bnd], box);

    const phases = Object.entries(s.phases || {}).filter(([k, val]) => k.endsWith("_ms") && val > 0);
    const total = phases.reduce((a, [, val]) => a + val, 0);
    const bar = document.getElementById("phases");
    bar.replaceChildren(...phases.map(([k, val], i) => el("div", { style: `width:${(100 * val) / total}%;background:${COLOURS[i % COLOURS.length]}`,
                                                                    title: `${k.replace(/_ms$/, "")}: ${ms(val)} ms`, text: k.replace(/_ms$/, "") })));
    const text = phases.map(([k, val]) => `${k.replace(/_ms$/, "")} ${ms(val)} ms`).join(", ");
    bar.setAttribute("aria-label", "Planner phases: " + text);
    document.getElementById("phases-text").textContent = text + (s.fallback_reason ? ". Solver note: " + s.fallback_reason : "");
  }

  function renderStatic(v) {
    const sb = v.static_baseline || {};
    const items = [["lower bound", v.lower_bound_s, "var(--bound)"], ["this plan", v.predicted_step_time_s, COLOURS[0]],
                   ["static, size " + (sb.degree || "?"), sb.predicted_step_time_s, COLOURS[1]]].filter(([, val]) => val);
    const max = Math.max(...items.map(([, val]) => val));
    const box = document.getElementById("static-bars");
    box.replaceChildren(...items.flatMap(([label, val, colour]) => [el("span", { text: label }),
      el("div", { class: "bar", role: "img", "aria-label": `${label}: ${secs(val)} s`, style: `width:${(100 * val) / max}%;background:${colour}` }),
      el("span", { class: "num", text: secs(val) + " s" })]));
    if (!sb.predicted_step_time_s) box.append(el("span", { class: "muted", style: "grid-column: 1 / -1", text: "This plan carries no static baseline." }));
  }

  function renderComms(v) {
    const isNew = new Set((v.new_communicators || []).map((c) => c.join(",")));
    const known = v.new_communicators !== null && v.new_communicators !== undefined;
    document.getElementById("comm-text").textContent = `${v.communicators.length} process group(s) of more than one rank` +
      (known ? `, ${isNew.size} of them new to the job.` : ".");
    document.querySelector("#comms tbody").replaceChildren(...v.communicators.map((c) => el("tr", {}, el("td", { class: "num", text: c.length }),
      el("td", { text: rankList(c) }), el("td", { text: known ? (isNew.has(c.join(",")) ? "yes" : "no") : "\u2013" }))));
  }

  function renderFeedback(v) {
    const tbody = document.querySelector("#feedback tbody");
    if (!v.feedback.length) { tbody.replaceChildren(el("tr", {}, el("td", { colspan: 6, text: "No feedback yet: trainers send it with POST /v1/plans/{id}/feedback." }))); return; }
    tbody.replaceChildren(...v.feedback.map((f) => el("tr", {}, el("td", { text: when(f.created_at) }), el("td", { class: "num", text: f.step ?? "\u2013" }),
      el("td", { class: "num", text: secs(f.measured_step_time_s) }), el("td", { class: "num", text: secs(f.predicted_step_time_s) }),
      el("td", { class: "num", text: f.predicted_step_time_s ? num(f.measured_step_time_s / f.predicted_step_time_s, 3) : "\u2013" }),
      el("td", { text: f.notes || "" }))));
  }

  document.addEventListener("DOMContentLoaded", async () => {
    const id = planIdFromPath();
    document.getElementById("plan-id").textContent = id;
    document.getElementById("tuning-link").href = `/dashboard/plans/${encodeURIComponent(id)}/tuning`;
    document.getElementById("json-link").href = `/v1/plans/${encodeURIComponent(id)}`;
    try {
      const v = await api(`/v1/dashboard/plans/${encodeURIComponent(id)}`);
      document.title = `Plan ${id.slice(0, 8)} \u00b7 dhp-planner dashboard`;
      document.getElementById("plan-status").textContent = "\u00b7 " + v.status + ", created " + when(v.created_at);
      if (v.status !== "done") {
        showError({ message: v.status === "pending" ? "This plan is still being solved; reload in a moment." : "This plan failed: " + ((v.error && v.error.detail) || "no detail") });
      } else {
        renderCards(v);
        renderGroups(v);
        renderGantt(v);
        renderTrace(v);
        renderStatic(v);
        renderComms(v);
      }
      renderFeedback(v);
      document.body.dataset.ready = "1";
    } catch (err) { showError(err); document.body.dataset.ready = "error"; }
  });
})();
