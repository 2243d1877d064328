// Shared by every dashboard page: the token, calls to the JSON API, number formats, the page's error line.
"use strict";

const DHP = (() => {
  const TOKEN_KEY = "dhp.token";

  function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

  function setupTokenForm() {
    const form = document.getElementById("token-form");
    if (!form) return;
    const input = form.querySelector("input");
    input.value = token();
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      if (input.value.trim()) sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      else sessionStorage.removeItem(TOKEN_KEY);
      location.reload();
    });
  }

  class ApiError extends Error {
    constructor(status, problem, fallback) {
      super((problem && problem.detail) || fallback);
      this.status = status;
      this.problem = problem;
    }
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json" };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const tok = token();
    if (tok) headers.Authorization = "Bearer " + tok;
    const res = await fetch(path, { method: options.method || "GET", headers,
                                    body: options.body === undefined ? undefined : JSON.stringify(options.body) });
    const text = await res.text();
    let doc = null;
    try { doc = text ? JSON.parse(text) : null; } catch (e) { doc = null; }
    if (!res.ok) throw new ApiError(res.status, doc, res.status + " " + res.statusText);
    return doc;
  }

  // Shows an API error where the page keeps its alert; a 401 points at the token field.
  function showError(err) {
    const box = document.getElementById("alert");
    const p = err && err.problem;
    let msg = err && err.message ? err.message : String(err);
    if (p && p.field) msg = p.field + ": " + msg;
    if (p && p.hint) msg += " " + p.hint;
    if (err && err.status === 401) msg = "This service needs an API token: enter one of its DHP_TOKENS in the field at the top right. (" + msg + ")";
    box.textContent = msg;
    box.hidden = false;
    if (err && err.status === 401) document.getElementById("token").focus();
  }

  function clearError() { const box = document.getElementById("alert"); box.hidden = true; box.textContent = ""; }

  function num(v, digits = 3) { return v === null || v === undefined || Number.isNaN(v) ? "\u2013" : Number(v).toFixed(digits); }
  function secs(v) { return v === null || v === undefined ? "\u2013" : (v >= 100 ? v.toFixed(1) : v >= 10 ? v.toFixed(2) : v.toFixed(3)); }
  function ms(v) { return v === null || v === undefined ? "\u2013" : (v >= 100 ? v.toFixed(0) : v.toFixed(1)); }
  function pct(v, digits = 1) { return v === null || v === undefined ? "\u2013" : (100 * v).toFixed(digits) + "%"; }
  function when(iso) {
    if (!iso) return "\u2013";
    const d = new Date(iso);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  // Month, day and time only (the table's column); the full time is in the cell's title.
  function shortWhen(iso) { return iso ? when(iso).slice(5) : "\u2013"; }

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  // A plan id short enough for a table cell that still tells plans apart: a plan's first 8 digits; for an epoch
  // job's step (the job's id, a dash and the step, GET /v1/jobs) the job's first 8 digits and the step number.
  function shortId(id) {
    const m = /^(.+)-0*(\d+)$/.exec(id);
    return m ? `${m[1].slice(0, 8)}\u2026 step ${m[2]}` : id.slice(0, 8);
  }

  // The backend a plan asked for and the one that ran: one name when they are the same, else both with an arrow.
  function backendText(asked, ran) {
    if (!ran) return (asked || "auto") + " \u2192 \u2013";
    return !asked || asked === ran ? ran : asked + " \u2192 " + ran;
  }

  // The plan id in the page's path: /dashboard/plans/<id>[/tuning].
  function planIdFromPath() {
    const m = location.pathname.match(/\/dashboard\/plans\/([^/]+)/);
    return m ? decodeURIComponent(m[1]) : null;
  }

  // Colours of series, chosen to stay apart for common colour-vision deficiencies (Okabe-Ito).
  const COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"];

  // Width a chart may take inside its container.
  function chartWidth(node, max = 980) { return Math.max(320, Math.min(max, node.clientWidth - 14)); }

  document.addEventListener("DOMContentLoaded", setupTokenForm);
  return { api, showError, clearError, num, secs, ms, pct, when, shortWhen, el, shortId, backendText, planIdFromPath,
           COLOURS, chartWidth };
})();
