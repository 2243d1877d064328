// The plans table: filters, server-side sorting and pages, live refresh while trainers post.
"use strict";

(() => {
  const { api, showError, clearError, num, secs, ms, pct, when, shortWhen, el, shortId, backendText } = DHP;
  const form = document.getElementById("filters");
  const tbody = document.querySelector("#plans tbody");
  const FILTERS = ["status", "backend", "cluster", "model", "created_after", "created_before", "id_prefix"];
  const state = { sort: "created_at", order: "desc", offset: 0, limit: 50, filters: {} };
  let stamp = null;
  let shownIds = new Set();
  // Rows that arrived by live refresh, with when they first showed. A re-read within FRESH_MS (a plan
  // finishing, a bound stored afterwards) keeps the highlight where it was instead of dropping it.
  const freshSince = new Map();
  const FRESH_MS = 10_000;

  function readUrl() {
    const q = new URLSearchParams(location.search);
    state.sort = q.get("sort") || "created_at";
    state.order = q.get("order") === "asc" ? "asc" : "desc";
    state.offset = Math.max(0, parseInt(q.get("offset") || "0", 10) || 0);
    state.limit = parseInt(q.get("limit") || "50", 10) || 50;
    for (const f of FILTERS) state.filters[f] = q.get(f) || "";
  }

  function writeUrl() {
    const q = new URLSearchParams();
    for (const f of FILTERS) if (state.filters[f]) q.set(f, state.filters[f]);
    if (state.sort !== "created_at") q.set("sort", state.sort);
    if (state.order !== "desc") q.set("order", state.order);
    if (state.offset) q.set("offset", state.offset);
    if (state.limit !== 50) q.set("limit", state.limit);
    const s = q.toString();
    history.replaceState(null, "", location.pathname + (s ? "?" + s : ""));
  }

  function toIso(local) { return local ? new Date(local).toISOString() : ""; }

  function query() {
    const q = new URLSearchParams({ sort: state.sort, order: state.order, offset: state.offset, limit: state.limit });
    for (const f of FILTERS) {
      const v = state.filters[f];
      if (v) q.set(f, f.startsWith("created_") ? toIso(v) : v);
    }
    return q;
  }

  function fillForm() {
    for (const f of FILTERS) form.elements[f].value = state.filters[f];
    form.elements.limit.value = String(state.limit);
  }

  async function loadFacets() {
    const facets = await api("/v1/dashboard/facets");
    for (const name of ["status", "backend", "cluster", "model"]) {
      const select = form.elements[name];
      for (const v of facets[name]) select.append(el("option", { value: v, text: v }));
      select.value = state.filters[name];
    }
  }

  function markSort() {
    for (const th of document.querySelectorAll("#plans th[data-sort]")) {
      if (th.dataset.sort === state.sort) th.setAttribute("aria-sort", state.order === "asc" ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
  }

  const DASH = "\u2013";
  const or = (v) => v || DASH;
  function planLink(p) {
    const short = shortId(p.id);
    return el("a", { href: "/dashboard/plans/" + encodeURIComponent(p.id), text: short, title: p.id,
                     "aria-label": "Plan " + short + " of " + p.n_samples + " samples on " + p.n_ranks + " ranks" });
  }
  function measured(p) {
    if (p.measured_step_time_s === null) return DASH;
    return secs(p.measured_step_time_s) + (p.feedback_count > 1 ? " (" + p.feedback_count + ")" : "");
  }
  // The table's columns, once: the header, the sort key (a column of GET /v1/dashboard/plans; "first"
  // is the order of a first click), numbers aligned right, and the cell of a plan row.
  const COLUMNS = [
    { label: "Time", sort: "created_at", first: "desc", text: (p) => shortWhen(p.created_at), title: (p) => when(p.created_at) },
    { label: "Plan", child: planLink },
    { label: "Samples", sort: "n_samples", first: "desc", num: true, text: (p) => p.n_samples },
    { label: "Ranks", sort: "n_ranks", num: true, text: (p) => p.n_ranks },
    { label: "Cluster", sort: "cluster", text: (p) => or(p.cluster) },
    { label: "Model", sort: "model", text: (p) => or(p.model) },
    { label: "Profile", text: (p) => p.profile_name, title: (p) => p.profile },
    { label: "Backend", sort: "backend", text: (p) => backendText(p.backend_asked, p.backend),
      title: (p) => "asked for " + p.backend_asked + ", ran " + (p.backend || "nothing yet") },
    { label: "Budget ms", sort: "budget_ms", num: true, text: (p) => ms(p.budget_ms) },
    { label: "Wall ms", sort: "solve_ms", num: true, text: (p) => ms(p.solve_ms) },
    { label: "Predicted s", sort: "predicted_step_time_s", num: true, text: (p) => secs(p.predicted_step_time_s) },
    { label: "Bound s", sort: "lower_bound_s", num: true, text: (p) => secs(p.lower_bound_s) },
    { label: "Gap", sort: "gap", num: true, text: (p) => pct(p.gap) },
    { label: "vs static", sort: "speedup", first: "desc", num: true,
      text: (p) => (p.speedup === null ? DASH : num(p.speedup, 2) + "\u00d7") },
    { label: "Measured s", sort: "measured_step_time_s", num: true, text: measured },
    { label: "Status", sort: "status", text: (p) => p.status, cls: (p) => "status-" + p.status },
  ];

  function header(c) {
    const attrs = { scope: "col", class: c.num ? "num" : null, "data-sort": c.sort || null };
    return el("th", attrs, c.sort ? el("button", { type: "button", text: c.label }) : c.label);
  }

  function cell(c, p) {
    const cls = [c.num ? "num" : null, c.cls ? c.cls(p) : null].filter(Boolean).join(" ") || null;
    const attrs = { class: cls, text: c.text ? c.text(p) : null, title: c.title ? c.title(p) : null };
    return el("td", attrs, c.child ? c.child(p) : null);
  }

  function row(p, since) {
    const attrs = { "data-id": p.id };
    if (since !== undefined) {
      attrs.class = "fresh";
      attrs.style = `animation-delay: -${Date.now() - since}ms`;
    }
    return el("tr", attrs, ...COLUMNS.map((c) => cell(c, p)));
  }

  function markFresh(items, previous) {
    const now = Date.now();
    for (const [id, since] of freshSince) if (now - since > FRESH_MS) freshSince.delete(id);
    for (const p of items) if (!previous.has(p.id) && !freshSince.has(p.id)) freshSince.set(p.id, now);
  }

  async function loadTable(live = false) {
    const page = await api("/v1/dashboard/plans?" + query());
    const previous = shownIds;
    shownIds = new Set(page.items.map((p) => p.id));
    if (live) markFresh(page.items, previous);
    else freshSince.clear();
    tbody.replaceChildren(...page.items.map((p) => row(p, freshSince.get(p.id))));
    if (!page.items.length) tbody.append(el("tr", {}, el("td", { colspan: COLUMNS.length, text: "No plans match these filters." })));
    const first = page.total ? page.offset + 1 : 0;
    const last = page.offset + page.items.length;
    document.getElementById("page-info").textContent = `Plans ${first}\u2013${last} of ${page.total}`;
    document.getElementById("plans-caption").textContent = `${page.total} plans, sorted by ${state.sort.replaceAll("_", " ")} (${state.order === "asc" ? "ascending" : "descending"})`;
    document.getElementById("prev").disabled = page.offset === 0;
    document.getElementById("next").disabled = page.next_offset === null;
    markSort();
    writeUrl();
    clearError();
  }

  async function poll() {
    if (!document.getElementById("live").checked || document.hidden) return;
    try {
      const now = await api("/v1/dashboard/changes");
      const key = JSON.stringify(now);
      if (stamp !== null && key !== stamp) {
        await loadTable(true);
        document.getElementById("updated").textContent = "Updated at " + new Date().toLocaleTimeString() + ": " + now.plans + " plans, " + now.feedback + " feedback.";
      }
      stamp = key;
    } catch (err) { showError(err); }
  }

  document.querySelector("#plans thead").addEventListener("click", (ev) => {
    const th = ev.target.closest("th[data-sort]");
    if (!th || !ev.target.closest("button")) return;
    const key = th.dataset.sort;
    if (state.sort === key) state.order = state.order === "asc" ? "desc" : "asc";
    else { state.sort = key; state.order = COLUMNS.find((c) => c.sort === key).first || "asc"; }
    state.offset = 0;
    loadTable().catch(showError);
  });

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (!form.reportValidity()) return;
    for (const f of FILTERS) state.filters[f] = form.elements[f].value.trim();
    state.limit = parseInt(form.elements.limit.value, 10);
    state.offset = 0;
    loadTable().catch(showError);
  });
  form.addEventListener("change", (ev) => { if (ev.target.tagName === "SELECT") form.requestSubmit(); });
  form.addEventListener("reset", () => { setTimeout(() => form.requestSubmit(), 0); });

  document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); loadTable().catch(showError); });
  document.getElementById("next").addEventListener("click", () => { state.offset += state.limit; loadTable().catch(showError); });

  document.querySelector("#plans thead").replaceChildren(el("tr", {}, ...COLUMNS.map(header)));

  document.addEventListener("DOMContentLoaded", async () => {
    readUrl();
    fillForm();
    try {
      const changes = api("/v1/dashboard/changes").catch((err) => err);  // in parallel; its error, if any, is thrown below
      await Promise.all([loadFacets(), loadTable()]);
      const now = await changes;
      if (now instanceof Error) throw now;
      stamp = JSON.stringify(now);
      document.body.dataset.ready = "1";
    } catch (err) { showError(err); document.body.dataset.ready = "error"; }
    setInterval(poll, 3000);
  });
})();
