// The onceq console: plain JavaScript over the JSON API (/api/openapi.json).
// Every value from the API is written with textContent: a message body, an id or a
// reason is text, never HTML. Views are hash routes:
//   #/flows  #/failures  #/failures/FLOW/REASON  #/message/FLOW/KEY  #/search/ID
"use strict";

const POLL_MS = 2000; // the flows view refreshes itself at most this often
let session = { csrf: "", read_only: true };
let timer = null;

function token() { return sessionStorage.getItem("onceq-token") || ""; }

async function api(path, options) {
  const opts = Object.assign({ headers: {} }, options || {});
  if (token()) opts.headers["Authorization"] = "Bearer " + token();
  const response = await fetch(path, opts);
  let doc = null;
  try { doc = await response.json(); } catch (e) { doc = { error: "not JSON (" + response.status + ")" }; }
  if (response.status === 403 && /token/.test(doc.error || "")) askToken();
  if (!response.ok) throw new Error(doc.error || ("HTTP " + response.status));
  return doc;
}

function askToken() {
  const d = document.getElementById("token");
  if (!d.open) d.showModal();
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") e.addEventListener("click", v);
    else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// replaceChildren without the nulls of optional parts (it would write "null").
function fill(view, ...nodes) { view.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined)); }

function table(headers, rows, klass) {
  return el("table", { class: klass },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function num(v) { return el("td", { class: "n" }, v === null || v === undefined ? "–" : String(v)); }

function notice(text, klass) {
  const n = document.getElementById("notice");
  n.textContent = text || "";
  n.className = klass || "";
}

function spark(values) {
  const w = 90, h = 18, ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark"); svg.setAttribute("width", w); svg.setAttribute("height", h);
  svg.setAttribute("role", "img"); svg.setAttribute("aria-label", "done per refresh");
  if (values.length > 1) {
    const max = Math.max(1, ...values);
    const pts = values.map((v, i) => (i * w / (values.length - 1)).toFixed(1) + "," + (h - 1 - v * (h - 2) / max).toFixed(1));
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", "#1b7f3a"); line.setAttribute("stroke-width", "1.5");
    svg.append(line);
  }
  return svg;
}

// The depth columns: every labelled depth the server gives for the flows' queues (each
// source type names its own: a directory queue's folders, a broker's ready and in
// flight, a consumer's pending), in the order they first come; a flow shows "–" under
// a column its kind has not. Nothing here knows a kind of source.
function depthColumns(flows) {
  const cols = new Map();
  for (const f of flows) for (const d of f.depths || []) if (!cols.has(d.key)) cols.set(d.key, d.label);
  return cols;
}

function depthCell(d, key) {
  const cell = num(d === undefined || d.value === null ? null
    : d.unit ? d.value.toFixed(0) + " " + d.unit : d.value);
  cell.setAttribute("data-depth", key);
  return cell;
}

async function showFlows(view) {
  const doc = await api("/api/flows");
  const cols = depthColumns(Object.values(doc.flows));
  const rows = Object.entries(doc.flows).map(([name, f]) => {
    const r = (f.rates && f.rates.per_minute) || {};
    const mine = new Map((f.depths || []).map((d) => [d.key, d]));
    const consumers = f.consumers.map((c) =>
      el("div", { class: c.stale ? "bad" : "" }, c.host + " pid " + c.pid + " · " +
        (c.age_s === null ? "?" : c.age_s.toFixed(0) + " s ago") + (c.stale ? " · stale" : " · " + c.status)));
    return el("tr", { "data-flow": name },
      el("td", {}, el("strong", {}, name), el("div", { class: "muted" }, f.source || "")),
      num(r.done), num(r.duplicate), num(r.retried), num(r.dead),
      el("td", {}, spark((f.rates && f.rates.spark) || [])),
      [...cols.keys()].map((key) => depthCell(mine.get(key), key)),
      el("td", { class: f.breaker === "open" ? "bad" : "" }, f.breaker || "–"),
      el("td", {}, consumers.length ? consumers : el("span", { class: "muted" }, "none")),
      el("td", { class: "n processed" }, f.ledger ? String(f.ledger.processed) : "–"),
      el("td", { class: "bad" }, f.queue_error || ""));
  });
  fill(view, 
    el("h1", {}, "Flows"),
    el("p", { class: "muted" }, "ledger " + (doc.ledger.target || "?") + " · updated " + doc.generated_at),
    table(["flow", "done/min", "dup/min", "retried/min", "dead/min", "trend", ...cols.values(),
      "breaker", "consumers", "processed", ""], rows, "flows"));
}

async function showFailures(view) {
  const doc = await api("/api/failures");
  const rows = doc.groups.map((g) => el("tr", {
    class: "link", "data-flow": g.flow, "data-reason": g.reason,
    onclick: () => { location.hash = "#/failures/" + encodeURIComponent(g.flow) + "/" + encodeURIComponent(g.reason); },
  }, el("td", {}, g.flow), el("td", { class: "bad" }, g.reason), num(g.count),
    el("td", {}, when(g.first)), el("td", {}, when(g.last)), el("td", { class: "muted" }, g.where)));
  const errs = Object.entries(doc.errors).map(([f, e]) => el("p", { class: "bad" }, f + ": " + e));
  fill(view, el("h1", {}, "Failures"), ...errs,
    rows.length ? table(["flow", "reason", "count", "first (UTC)", "last (UTC)", "in"], rows, "groups")
      : el("p", { class: "ok" }, "No dead letters."));
}

async function showGroup(view, flow, reason) {
  const [doc, flows] = await Promise.all([
    api("/api/failures/" + encodeURIComponent(flow) + "?reason=" + encodeURIComponent(reason)),
    api("/api/flows"),
  ]);
  const actions = (flows.flows[flow] && flows.flows[flow].actions) || [];
  const boxes = [];
  const rows = doc.items.map((it) => {
    const box = el("input", { type: "checkbox", value: it.key, "aria-label": "select " + it.key, disabled: !it.key });
    boxes.push(box);
    return el("tr", { "data-key": it.key },
      el("td", {}, box),
      el("td", {}, it.key ? el("a", { href: "#/message/" + encodeURIComponent(flow) + "/" + encodeURIComponent(it.key) }, it.key) : "(no id)"),
      el("td", {}, it.detail || ""), num(it.attempts), el("td", {}, when(it.died_at)), num(it.size));
  });
  const chosen = () => boxes.filter((b) => b.checked).map((b) => b.value);
  const buttons = [];
  for (const action of actions) {
    const danger = action === "purge" ? "danger" : null;
    buttons.push(el("button", { class: danger, "data-action": action + "-selected", onclick: () => {
      const keys = chosen();
      if (!keys.length) { notice("Select dead letters first.", "warn"); return; }
      act(action, flow, { keys: keys }, keys.length);
    } }, cap(action) + " selected"));
    buttons.push(el("button", { class: danger, "data-action": action + "-all", onclick: () =>
      act(action, flow, { reason: reason }, doc.items.length) }, cap(action) + " all " + doc.items.length));
  }
  fill(view, 
    el("h1", {}, flow + " · " + reason),
    el("p", { class: "muted" }, doc.items.length + " dead letter(s)"),
    actions.length && doc.items.length ? el("div", { class: "actions" }, buttons) : null,
    table(["", "key", "detail", "attempts", "died (UTC)", "bytes"], rows, "items"));
}

// 2026-12-06T23:13:10.795570+00:00 -> 2026-12-06 23:13:10 (every time shown is UTC)
function when(iso) { return iso ? String(iso).replace("T", " ").slice(0, 19) : "–"; }

function cap(s) { return s.charAt(0).toUpperCase() + s.slice(1); }

function confirmDialog(text) {
  return new Promise((resolve) => {
    const d = document.getElementById("confirm");
    document.getElementById("confirm-text").textContent = text;
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.returnValue = "";
    d.showModal();
  });
}

const DONE = { replay: "Replayed", purge: "Purged" };
let acting = false;
async function act(action, flow, selection, count) {
  if (acting || session.read_only) return; // one action at a time; a double click does nothing
  const what = action + " " + count + " dead letter(s) of flow " + flow;
  if (!(await confirmDialog(cap(what) + "?"))) { notice("Nothing done.", "muted"); return; }
  acting = true;
  const body = Object.assign({ expect: count, request_id: requestId() }, selection);
  try {
    const doc = await api("/api/flows/" + encodeURIComponent(flow) + "/dead/" + action, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": session.csrf },
      body: JSON.stringify(body),
    });
    const skipped = doc.skipped.length ? ", " + doc.skipped.length + " left: " + doc.skipped.map((s) => s.key + " (" + s.why + ")").join("; ") : "";
    notice(DONE[action] + " " + doc.done + " of " + doc.matched + (doc.op ? " (audit #" + doc.op + ")" : "") + skipped + ".", "ok");
  } catch (e) {
    notice(cap(action) + " refused: " + e.message, "bad");
  } finally {
    acting = false;
  }
  route();
}

function requestId() {
  const a = new Uint8Array(16);
  crypto.getRandomValues(a);
  return Array.from(a, (b) => b.toString(16).padStart(2, "0")).join("");
}

function journeys(list) {
  if (!list.length) return [el("p", { class: "muted" }, "The ledger holds no journey for it.")];
  return list.map((j) => el("section", { class: "journey", "data-flow": j.flow },
    el("h2", {}, j.flow + " · " + (j.msg_id || "(never parsed)") + " · ", el("span", { class: j.state === "done" ? "ok" : "bad" }, j.state)),
    table(["at (UTC)", "step", "attempt", "reason", "detail", "ref"], j.steps.map((s) => el("tr", { "data-step": s.step },
      el("td", {}, when(s.at)), el("td", {}, s.step), num(s.attempt), el("td", {}, s.reason || ""),
      el("td", {}, s.op ? s.op.op + " #" + s.op.id + " (" + s.op.count + ")" : (s.delay_s !== null && s.delay_s !== undefined ? "next try in " + s.delay_s + " s" : "") + (s.detail || "")),
      el("td", {}, s.ref || ""))), "steps")));
}

async function showMessage(view, flow, key) {
  const doc = await api("/api/flows/" + encodeURIComponent(flow) + "/dead?key=" + encodeURIComponent(key));
  const props = Object.entries(doc.properties).map(([k, v]) =>
    el("tr", {}, el("th", {}, k), el("td", {}, typeof v === "string" ? v : JSON.stringify(v))));
  fill(view, 
    el("h1", {}, flow + " · " + key),
    el("p", {}, el("span", { class: "bad" }, doc.reason), " · " + (doc.detail || "") + " · attempts " + (doc.attempts ?? "–") + " · " + doc.where),
    el("h2", {}, "Body" + (doc.body_json ? " (JSON)" : "")),
    el("pre", { class: "body" }, doc.body),
    doc.body_cut ? el("p", { class: "warn" }, doc.body_cut) : null,
    el("h2", {}, "Properties"),
    table(["", ""], props, "props"),
    el("h2", {}, "Journey"),
    ...journeys(doc.journeys));
}

async function showSearch(view, id) {
  const doc = await api("/api/search?id=" + encodeURIComponent(id));
  fill(view, el("h1", {}, "Journey of " + id), ...journeys(doc.journeys));
}

async function route() {
  clearTimeout(timer);
  const view = document.getElementById("view");
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const page = parts[0] || "flows";
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("here", a.id === "nav-" + page);
  try {
    if (page === "failures" && parts.length >= 3) await showGroup(view, parts[1], parts.slice(2).join("/"));
    else if (page === "failures") await showFailures(view);
    else if (page === "message") await showMessage(view, parts[1], parts.slice(2).join("/"));
    else if (page === "search") await showSearch(view, parts.slice(1).join("/"));
    else await showFlows(view);
  } catch (e) {
    fill(view, el("p", { class: "bad" }, e.message));
  }
  if (page === "flows" || page === "") timer = setTimeout(route, POLL_MS);
}

async function start() {
  const params = new URLSearchParams(location.search);
  if (params.get("token")) { // keep it in this tab only, and out of the address bar
    sessionStorage.setItem("onceq-token", params.get("token"));
    history.replaceState(null, "", location.pathname + location.hash);
  }
  document.getElementById("token-form").addEventListener("submit", () => {
    sessionStorage.setItem("onceq-token", document.getElementById("token-value").value);
    start();
  });
  document.getElementById("search").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const id = document.getElementById("search-id").value.trim();
    if (id) location.hash = "#/search/" + encodeURIComponent(id);
  });
  try { session = await api("/api/session"); } catch (e) { notice(e.message, "bad"); return; }
  document.getElementById("mode").textContent = session.read_only ? "read-only" : "";
  window.addEventListener("hashchange", () => { notice(""); route(); });
  route();
}

document.addEventListener("DOMContentLoaded", start);
