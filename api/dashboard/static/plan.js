// One plan: figures, the micro-batches x ranks Gantt chart, the solver's trace and phases, the static baseline,
// the communicators, per-group times and feedback.
"use strict";

(() => {
  const { api, showError, num, secs, ms, pct, when, el, shortId, backendText, planIdFromPath, COLOURS,
          chartWidth } = DHP;
  const SVG = "http://www.w3.org/2000/svg";
  // Colours of GPU types in a cluster of several (apart from the blocks' blue and magenta).
  const GPU_COLOURS = [COLOURS[4], COLOURS[2], COLOURS[7], COLOURS[6]];

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
      ["Planner", backendText(v.backend_asked, s.backend) + " \u00b7 " + (s.status || "\u2013"),
       (s.wall_ms !== undefined ? ms(s.wall_ms) + " ms of a " + ms(v.budget_ms) + " ms budget; " : "") +
       "asked for " + v.backend_asked],
      ["Batch", v.n_samples + " samples", v.n_ranks + " ranks"],
      ["Cluster \u00b7 model", (v.cluster || "\u2013"), (v.model || "\u2013") + " \u00b7 profile: " + v.profile_name],
    ];
    dl.replaceChildren(...items.flatMap(([a, b, c]) => card(a, b, c)));
  }

  // --- the Gantt chart -------------------------------------------------------------------------
  // The cluster's GPU types in the order of their first node: name, colour and nodes (several in a mixed cluster).
  function gpuTypes(g) {
    const types = [];
    (g.node_gpus || []).forEach((name, k) => {
      let t = types.find((x) => x.name === name);
      if (!t) { t = { name, colour: GPU_COLOURS[types.length % GPU_COLOURS.length], nodes: [] }; types.push(t); }
      t.nodes.push(k);
    });
    return types;
  }

  // Which nodes hold which GPU type, beside the chart's legend: a swatch per type in a mixed cluster.
  function renderGpuLegend(g, types) {
    const box = document.getElementById("gpu-legend");
    if (!types.length) { box.hidden = true; return; }
    box.hidden = false;
    if (types.length === 1) {
      box.replaceChildren(el("span", { text: "GPUs: " + types[0].name + " on every node" }));
      return;
    }
    box.replaceChildren(el("span", { text: "GPU types:" }), ...types.map((t) => {
      const ranks = t.nodes.flatMap((k) => {
        const [a, b] = g.nodes[k];
        return Array.from({ length: b - a }, (_, i) => a + i);
      });
      return el("span", { class: "gpu-type" }, el("span", { class: "swatch", style: "background:" + t.colour }),
        `${t.name}: node${t.nodes.length > 1 ? "s" : ""} ${rankList(t.nodes)} (ranks ${rankList(ranks)})`);
    }));
  }

  function renderGantt(v) {
    const g = v.gantt;
    const box = document.getElementById("gantt");
    const domain = g.domain_size;
    const types = gpuTypes(g);
    const mixed = types.length > 1;
    const gpusOf = (nodes) => [...new Set(nodes.map((k) => g.node_gpus[k]))].join(", ");
    renderGpuLegend(g, types);
    const left = mixed ? 140 : 64, top = 22, bottom = 28, right = 8;
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
        const label = svg("text", { class: "mb-label", x: x(mb.start_s) + 3, y: top - 7, "data-mb": mb.index });
        const dur = secs(mb.predicted_time_s);
        label.textContent = span >= 130 ? `micro-batch ${mb.index}: ${dur} s`
          : span >= 60 ? `mb ${mb.index}: ${dur} s` : `${mb.index}`;
        root.append(label);
      }
      for (const grp of mb.groups) {
        const w = Math.max(1, (grp.predicted_time_s / step) * plotW);
        const where = (grp.intra_node ? "within one node" : "spanning nodes " + grp.nodes.join(", ")) +
          (mixed && grp.nodes.length ? " (" + gpusOf(grp.nodes) + ")" : "");
        const text = `Micro-batch ${mb.index}, group ${grp.index}: size ${grp.degree} ` +
          `(ranks ${rankList(grp.ranks)}), ${grp.samples.length} sample(s), ` +
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
          const ranks = grp.degree === 1 ? "1 rank" : `${grp.degree} ranks`;
          const n = grp.samples.length;
          t.textContent = w > 80 ? `${ranks} \u00b7 ${n} smp` : `${grp.degree}\u00b7${n}`;
          node.append(t);
        }
        root.append(node);
        blocks.push({ node, mb, grp, text });
      }
      root.append(svg("line", { x1: x(mb.start_s), x2: x(mb.start_s), y1: top - 4, y2: top + plotH, stroke: "#24292f", "stroke-width": 1.5 }));
    }
    root.append(ticks);
    // Node boundaries and labels; in a mixed cluster each node's GPU type too, and a strip in its type's colour.
    g.nodes.forEach(([a, b], k) => {
      if (a > 0) root.append(svg("line", { x1: left - 6, x2: left + plotW, y1: top + a * rh, y2: top + a * rh, stroke: "#24292f", "stroke-width": 1 }));
      if (mixed) {
        const type = types.find((t) => t.name === g.node_gpus[k]);
        const strip = svg("rect", { class: "gpu-strip", x: left - 6, y: top + a * rh + 1, width: 5,
                                    height: Math.max(1, (b - a) * rh - 2), fill: type.colour });
        const title = svg("title");
        title.textContent = `node ${k}: ${type.name}, ranks ${a}\u2013${b - 1}`;
        strip.append(title);
        root.append(strip);
      }
      if ((b - a) * rh >= 11) {
        const t = svg("text", { class: "node-label", x: 4, y: top + ((a + b) / 2) * rh + 4 });
        t.textContent = mixed ? `node ${k} \u00b7 ${g.node_gpus[k]}` : `node ${k}`;
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
    const mixed = new Set(v.gantt.node_gpus || []).size > 1;
    const rows = [];
    for (const mb of v.gantt.micro_batches) {
      for (const g of mb.groups) {
        const types = [...new Set(g.nodes.map((k) => v.gantt.node_gpus[k]))];
        const gpus = mixed && g.nodes.length ? " \u00b7 " + types.join(", ") : "";
        rows.push(el("tr", {}, el("td", { class: "num", text: mb.index }), el("td", { class: "num", text: g.index }),
          el("td", { text: rankList(g.ranks) }), el("td", { class: "num", text: g.degree }),
          el("td", { text: (g.nodes.join(", ") || "\u2013") + (g.intra_node ? "" : " (spans nodes)") + gpus }),
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
    const name = (k) => k.replace(/_ms$/, "");
    const colour = (i) => COLOURS[i % COLOURS.length];
    const bar = document.getElementById("phases");
    const segments = phases.map(([k, val], i) => el("div", {
      style: `width:${(100 * val) / total}%;background:${colour(i)};color:${ink(colour(i))}`,
      title: `${name(k)}: ${ms(val)} ms (${pct(val / total)})`, text: name(k) }));
    bar.replaceChildren(...segments);
    // A segment too narrow for its whole name shows none (its name stays in the tooltip and the legend below).
    for (const seg of segments) {
      if (seg.scrollWidth > seg.clientWidth) { seg.textContent = ""; seg.classList.add("narrow"); }
    }
    const text = phases.map(([k, val]) => `${name(k)} ${ms(val)} ms`).join(", ");
    bar.setAttribute("aria-label", "Planner phases: " + text);
    const legend = phases.map(([k, val], i) => el("span", { class: "phase" },
      el("span", { class: "swatch", style: "background:" + colour(i) }), `${name(k)} ${ms(val)} ms`));
    document.getElementById("phases-legend").replaceChildren(...legend);
    document.getElementById("phases-text").textContent = s.fallback_reason ? "Solver note: " + s.fallback_reason : "";
  }

  // Text colour readable on a background colour "#rrggbb": dark on light colours, white on dark ones.
  function ink(hex) {
    const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16) / 255);
    return 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 ? "#1b1f24" : "#fff";
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
      document.title = `Plan ${shortId(id)} \u00b7 dhp-planner dashboard`;
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
