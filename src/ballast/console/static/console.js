// Ballast console: plain JavaScript, no build step. Pages read the API under /api; one
// EventSource (/api/events) tells the page what changed, and only the visible page re-reads.
"use strict";

const PAGE = 100;
const $ = (sel) => document.querySelector(sel);
const state = {
  token: localStorage.getItem("ballast.token") || "",
  summary: null,
  brokers: { offset: 0 }, topics: { offset: 0 }, hist: { offset: 0 },
  plan: null, draining: null, topic: null,
};

// -- API ----------------------------------------------------------------------------------

async function api(path, opts = {}) {
  const headers = { "Content-Type": "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const resp = await fetch(path, { ...opts, headers });
  const body = await resp.json().catch(() => ({}));
  if (resp.status === 401 || resp.status === 403) { askToken(body.error); }
  if (!resp.ok) throw new Error(body.error || resp.statusText);
  return body;
}

function askToken(message) {
  const dlg = $("#login");
  if (dlg.open) return;
  $("#login-error").textContent = message || "";
  dlg.showModal();
  dlg.onclose = () => {
    state.token = $("#login-token").value.trim();
    localStorage.setItem("ballast.token", state.token);
    connect();
    route();
  };
}

function toast(text, error = false) {
  const t = $("#toast");
  t.textContent = text;
  t.className = "show" + (error ? " error" : "");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.className = ""; }, error ? 6000 : 3000);
}

function confirmDialog(text) {
  return new Promise((resolve) => {
    const dlg = $("#confirm");
    $("#confirm-text").textContent = text;
    dlg.returnValue = "";
    dlg.onclose = () => resolve(dlg.returnValue === "ok");
    dlg.showModal();
  });
}

// -- formatting ---------------------------------------------------------------------------

const esc = (s) => String(s ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const num = (v, d = 2) => (v === null || v === undefined ? "-" : Number(v).toFixed(d));
const pct = (v) => (v === null || v === undefined ? "-" : (100 * v).toFixed(1) + "%");
const when = (ts) => new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 23);
function age(s) {
  if (s === null || s === undefined) return "-";
  if (s < 120) return s.toFixed(0) + "s";
  if (s < 7200) return (s / 60).toFixed(0) + "m";
  return (s / 3600).toFixed(1) + "h";
}
const topicLink = (t) => `<a href="#/topic${esc(t)}">${esc(t)}</a>`;

function pager(el, page, total, reload) {
  const from = total ? page.offset + 1 : 0;
  const to = Math.min(total, page.offset + PAGE);
  el.innerHTML = `${from}–${to} of ${total}
    <button data-d="-1" ${page.offset === 0 ? "disabled" : ""}>‹ prev</button>
    <button data-d="1" ${to >= total ? "disabled" : ""}>next ›</button>`;
  el.querySelectorAll("button").forEach((b) => {
    b.onclick = () => { page.offset = Math.max(0, page.offset + PAGE * Number(b.dataset.d)); reload(); };
  });
}

// -- summary (every frame) ------------------------------------------------------------------

function renderSummary(s) {
  state.summary = s;
  document.body.dataset.version = s.version;
  const b = s.balance || {};
  $("#leader-decision").textContent = b.leader_decision || "—";
  const states = Object.entries(s.broker_states || {}).map(([k, v]) => `${v} ${k}`).join(", ");
  const cards = [
    ["brokers", s.brokers, states], ["topics", s.topics, ""], ["leader", s.leader || "—", ""],
    ["balance CV", pct(b.cv), `mean ${num(b.mean)} · min ${num(b.min)} · max ${num(b.max)}`],
    ["moves", s.moves, ""],
  ];
  $("#summary").innerHTML = cards.map(([k, v, sub]) =>
    `<div class="card" id="card-${k.replace(" ", "-")}"><div class="k">${k}</div>
     <div class="v">${esc(v)}</div><div class="note">${esc(sub)}</div></div>`).join("");
}

// -- cluster page -----------------------------------------------------------------------------

let lastRows = {};
async function loadBrokers() {
  const q = new URLSearchParams({ offset: state.brokers.offset, limit: PAGE,
    sort: $("#broker-sort").value });
  if ($("#broker-q").value) q.set("q", $("#broker-q").value);
  if ($("#broker-state").value) q.set("state", $("#broker-state").value);
  const page = await api("/api/brokers?" + q);
  const maxScore = Math.max(1e-9, ...page.items.map((r) => r.score || 0));
  const rows = {};
  $("#brokers tbody").innerHTML = page.items.map((r) => {
    const sig = JSON.stringify([r.state, r.topics, r.leader, num(r.score)]);
    rows[r.broker_id] = sig;
    const changed = lastRows[r.broker_id] !== undefined && lastRows[r.broker_id] !== sig;
    const action = r.state === "active"
      ? `<button class="drain" data-b="${esc(r.broker_id)}">Drain…</button>`
      : r.registered ? `<button class="activate" data-b="${esc(r.broker_id)}">Activate…</button>` : "";
    return `<tr data-broker="${esc(r.broker_id)}" data-state="${esc(r.state)}"
        class="${changed ? "flash" : ""}">
      <td>${esc(r.broker_id)}</td>
      <td class="state-${esc(r.state)}">${esc(r.state)}</td>
      <td>${r.leader ? "★" : ""}</td>
      <td class="num">${num(r.score)}<span class="bar" style="width:${Math.round(40 * (r.score || 0) / maxScore)}px"></span></td>
      <td class="num">${num(r.cpu_percent, 1)}</td><td class="num">${num(r.memory_percent, 1)}</td>
      <td class="num">${num(r.throughput_mbps)}</td>
      <td class="num topics">${r.topics}</td><td>${action}</td></tr>`;
  }).join("");
  lastRows = rows;
  pager($("#broker-pager"), state.brokers, page.total, loadBrokers);
  document.querySelectorAll("button.drain").forEach((b) => { b.onclick = () => drain(b.dataset.b); });
  document.querySelectorAll("button.activate").forEach((b) => { b.onclick = () => activate(b.dataset.b); });
  if (state.draining) drainProgress();
}

async function drain(broker) {
  const ok = await confirmDialog(`Drain ${broker}? The leader moves every topic away from it, ` +
    "then marks it drained. It receives no new topics until activated.");
  if (!ok) return;
  try {
    await api(`/api/brokers/${encodeURIComponent(broker)}/drain`, { method: "POST" });
    state.draining = { broker, start: null };
    toast(`${broker}: draining`);
    drainProgress();
  } catch (e) { toast(e.message, true); }
}

async function drainProgress() {
  const d = state.draining;
  if (!d) return;
  const el = $("#drain-progress");
  el.hidden = false;
  try {
    const r = await api(`/api/brokers/${encodeURIComponent(d.broker)}`);
    if (d.start === null) d.start = Math.max(1, r.topics);
    const done = d.start - r.topics;
    const finished = r.state === "drained";
    el.dataset.state = finished ? "drained" : "draining";
    el.innerHTML = finished
      ? `<b>${esc(d.broker)}: drained</b> — every topic moved away.`
      : `<b>${esc(d.broker)}: draining</b> — ${r.topics} topic(s) left ` +
        `<progress max="${d.start}" value="${done}"></progress>`;
    if (finished) state.draining = null;
  } catch (e) { el.textContent = e.message; }
}

async function activate(broker) {
  if (!await confirmDialog(`Activate ${broker}? It receives topics again.`)) return;
  try {
    await api(`/api/brokers/${encodeURIComponent(broker)}/activate`, { method: "POST" });
    toast(`${broker}: active`);
    $("#drain-progress").hidden = true;
  } catch (e) { toast(e.message, true); }
}

// -- balance page ---------------------------------------------------------------------------

const chart = { samples: [], moves: [] };
async function loadBalance() {
  const h = await api("/api/balance/history?points=400");
  chart.samples = h.samples;
  chart.moves = h.moves;
  drawChart();
  loadHistory();
}

function drawChart() {
  const svg = $("#balance-chart");
  const W = 1000, H = 320, L = 50, R = 50, T = 10, B = 30;
  const s = chart.samples, m = chart.moves;
  const times = s.map((x) => x.timestamp).concat(m.map((x) => x.timestamp));
  if (!times.length) { svg.innerHTML = `<text x="${L}" y="40">no balance posted yet</text>`; return; }
  let t0 = Math.min(...times), t1 = Math.max(...times);
  if (t1 - t0 < 1) { t0 -= 30; t1 += 30; }
  const maxCv = Math.max(0.01, ...s.map((x) => x.cv));
  const maxLoad = Math.max(1e-9, ...s.map((x) => x.max));
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
  const yCv = (v) => H - B - (H - T - B) * v / maxCv;
  const yLoad = (v) => H - B - (H - T - B) * v / maxLoad;
  const line = (pts) => pts.map((p, i) => (i ? "L" : "M") + p[0].toFixed(1) + "," + p[1].toFixed(1)).join("");
  const band = s.length ? line(s.map((p) => [x(p.timestamp), yLoad(p.max)])) +
    s.slice().reverse().map((p) => "L" + x(p.timestamp).toFixed(1) + "," + yLoad(p.min).toFixed(1)).join("") + "Z" : "";
  const ticks = [0, 0.5, 1].map((f) => `<text x="4" y="${yCv(maxCv * f) + 4}">${(100 * maxCv * f).toFixed(1)}%</text>
    <text x="${W - R + 4}" y="${yLoad(maxLoad * f) + 4}">${num(maxLoad * f, 1)}</text>`).join("");
  const tl = [t0, (t0 + t1) / 2, t1].map((t, i) =>
    `<text x="${x(t) - (i === 2 ? 60 : i === 1 ? 30 : 0)}" y="${H - 8}">${when(t).slice(11, 19)}</text>`).join("");
  const moves = m.map((mv, i) => `<line class="move" data-i="${i}" x1="${x(mv.timestamp)}" x2="${x(mv.timestamp)}"
      y1="${H - B}" y2="${H - B - 14}"><title>${esc(when(mv.timestamp))} ${esc(mv.topic)}: ${esc(mv.from_broker)} → ${esc(mv.to_broker)} — ${esc(mv.reason)} (est. load ${num(mv.estimated_load)})</title></line>`).join("");
  svg.innerHTML = `<line class="axis" x1="${L}" x2="${W - R}" y1="${H - B}" y2="${H - B}"/>
    <path class="band" d="${band}"/>
    <path class="mean" d="${line(s.map((p) => [x(p.timestamp), yLoad(p.mean)]))}"/>
    <path class="cv" d="${line(s.map((p) => [x(p.timestamp), yCv(p.cv)]))}"/>
    ${moves}${ticks}${tl}`;
  svg.querySelectorAll("line.move").forEach((el) => {
    el.onmouseenter = () => { $("#chart-tip").textContent = el.querySelector("title").textContent; };
  });
}

async function loadHistory() {
  const q = new URLSearchParams({ offset: state.hist.offset, limit: PAGE });
  for (const [k, id] of [["topic", "#hist-topic"], ["broker", "#hist-broker"], ["reason", "#hist-reason"]]) {
    if ($(id).value) q.set(k, $(id).value);
  }
  const page = await api("/api/history?" + q);
  $("#history tbody").innerHTML = page.items.map((mv) => `<tr>
    <td>${esc(when(mv.timestamp))}</td><td>${topicLink(mv.topic)}</td><td>${esc(mv.from_broker)}</td>
    <td>${esc(mv.to_broker)}</td><td>${esc(mv.reason)}</td><td class="num">${num(mv.estimated_load)}</td></tr>`).join("");
  pager($("#hist-pager"), state.hist, page.total, loadHistory);
}

// -- topics -----------------------------------------------------------------------------------

async function loadTopics() {
  const q = new URLSearchParams({ offset: state.topics.offset, limit: PAGE });
  if ($("#topic-q").value) q.set("q", $("#topic-q").value);
  if ($("#topic-owner").value) q.set("owner", $("#topic-owner").value);
  if ($("#topic-state").value) q.set("state", $("#topic-state").value);
  const page = await api("/api/topics?" + q);
  $("#topics tbody").innerHTML = page.items.map((t) => `<tr data-topic="${esc(t.topic)}">
    <td>${topicLink(t.topic)}</td><td class="owner">${esc(t.owner || "-")}</td><td>${esc(t.state)}</td>
    <td class="num">${age(t.age_seconds)}</td></tr>`).join("");
  pager($("#topic-pager"), state.topics, page.total, loadTopics);
}

async function loadTopic(name) {
  state.topic = name;
  $("#topic-name").textContent = name;
  try {
    const d = await api("/api/topics" + name.split("/").map(encodeURIComponent).join("/"));
    const p = d.placement;
    $("#topic-facts").innerHTML = `owner <b id="topic-owner-now">${esc(d.owner || "-")}</b> · state ${esc(d.state)} ·
      age ${age(d.age_seconds)}` + (d.marker ? ` · marker ${esc(d.marker.reason)} ${esc(d.marker.from_broker || "")} → ${esc(d.marker.to_broker || "")}` : "");
    $("#topic-placement").textContent = `if placed now: ${p.broker || "-"} — ${p.reason}`;
    const rows = Object.keys(p.scores).sort().map((b) => [b, p.scores[b],
      p.rejected[b] || (p.candidates.includes(b) ? (b === p.broker ? "chosen" : "candidate") : "")]);
    for (const [b, why] of Object.entries(p.rejected)) if (!(b in p.scores)) rows.push([b, null, why]);
    $("#verdicts tbody").innerHTML = rows.map(([b, sc, why]) =>
      `<tr data-broker="${esc(b)}"><td>${esc(b)}${b === d.owner ? " (owner)" : ""}</td><td class="num">${num(sc)}</td><td>${esc(why)}</td></tr>`).join("");
    $("#topic-unload").disabled = !d.owner;
  } catch (e) {
    $("#topic-facts").innerHTML = `<span class="error">${esc(e.message)}</span>`;
    $("#verdicts tbody").innerHTML = "";
  }
}

$("#topic-unload").onclick = async () => {
  const t = state.topic;
  if (!await confirmDialog(`Unload ${t}? Its owner seals it and the leader places it on another broker.`)) return;
  try {
    const r = await api("/api/topics" + t + "/unload", { method: "POST" });
    toast(`${t}: unloading from ${r.from_broker}`);
  } catch (e) { toast(e.message, true); }
};

// -- rebalance ------------------------------------------------------------------------------

$("#plan-run").onclick = async () => {
  const max = $("#plan-max").value;
  try {
    const plan = await api("/api/rebalance/plan" + (max ? "?max_moves=" + max : ""), { method: "POST" });
    state.plan = plan;
    renderPlan(plan, []);
    $("#plan-apply").disabled = plan.moves.length === 0;
  } catch (e) { toast(e.message, true); }
};

function renderPlan(plan, outcomes) {
  $("#plan-summary").innerHTML = `<b>${plan.moves.length} move(s)</b>, predicted CV
    <b>${pct(plan.before.cv)} → ${pct(plan.after.cv)}</b> — ${esc(plan.reason)}`;
  $("#plan-details").innerHTML = (plan.details || []).map((l) => `<li>${esc(l)}</li>`).join("");
  $("#plan tbody").innerHTML = plan.moves.map((m, i) => `<tr><td>${topicLink(m.topic)}</td>
    <td>${esc(m.from_broker)}</td><td>${esc(m.to_broker)}</td><td class="num">${num(m.estimated_load)}</td>
    <td class="outcome">${esc(outcomes[i] ? outcomes[i].reason : "planned")}</td></tr>`).join("");
}

$("#plan-apply").onclick = async () => {
  const plan = state.plan;
  if (!plan) return;
  if (!await confirmDialog(`Start ${plan.moves.length} move(s)? Each topic is sealed on its ` +
    "broker and placed on the planned one.")) return;
  try {
    const r = await api("/api/rebalance/apply", { method: "POST", body: JSON.stringify(plan) });
    renderPlan(plan, r.outcomes);
    $("#plan-apply").disabled = true;
    const started = r.outcomes.filter((o) => o.applied).length;
    toast(`${started} of ${r.outcomes.length} move(s) started`);
  } catch (e) { toast(e.message, true); }
};

// -- routing and live updates -----------------------------------------------------------------

function currentPage() {
  const h = location.hash.slice(1) || "/";
  if (h.startsWith("/topic/")) return ["topic", h.slice("/topic".length)];
  return [{ "/": "cluster", "/balance": "balance", "/topics": "topics", "/rebalance": "rebalance" }[h] || "cluster", null];
}

function route() {
  const [page, arg] = currentPage();
  document.querySelectorAll(".page").forEach((el) => { el.hidden = el.id !== "page-" + page; });
  document.querySelectorAll("nav a").forEach((a) => {
    a.classList.toggle("active", a.dataset.page === page || (page === "topic" && a.dataset.page === "topics"));
  });
  refresh(page, arg).catch((e) => toast(e.message, true));
}

async function refresh(page, arg) {
  if (page === "cluster") return loadBrokers();
  if (page === "balance") return loadBalance();
  if (page === "topics") return loadTopics();
  if (page === "topic") return loadTopic(decodeURIComponent(arg));
}

let pending = null;
function onFrame(update) {
  renderSummary(update.summary);
  const changed = new Set(update.changed);
  const [page, arg] = currentPage();
  const all = changed.has("all");
  const wants = { cluster: ["brokers"], balance: ["balance", "history"], topics: ["topics"],
    topic: ["topics", "brokers"], rebalance: [] }[page];
  if (page === "balance" && !all && update.sample) chart.samples.push(update.sample);
  if (page === "balance" && !all && update.moves.length) chart.moves.push(...update.moves);
  if (all || wants.some((w) => changed.has(w))) {
    if (page === "balance" && !all) { drawChart(); if (changed.has("history")) loadHistory(); return; }
    if (pending) return;  // coalesce bursts: at most one re-read per 200 ms
    pending = setTimeout(() => { pending = null; refresh(page, arg).catch(() => {}); }, 200);
  }
}

let source = null;
function connect() {
  if (source) source.close();
  source = new EventSource("/api/events" + (state.token ? "?token=" + encodeURIComponent(state.token) : ""));
  source.addEventListener("frame", (ev) => {
    $("#live-dot").className = "dot live";
    $("#live-text").textContent = "live";
    onFrame(JSON.parse(ev.data));
  });
  source.onerror = () => {
    $("#live-dot").className = "dot";
    $("#live-text").textContent = "reconnecting…";
    if (state.token === "" ) api("/api/summary").catch(() => {});  // surfaces a 401 as the login
  };
}

let typing = null;
for (const id of ["#broker-q", "#topic-q", "#topic-owner", "#hist-topic", "#hist-broker", "#hist-reason"]) {
  $(id).addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.brokers.offset = state.topics.offset = state.hist.offset = 0; route(); }, 250);
  });
}
for (const id of ["#broker-state", "#broker-sort", "#topic-state"]) $(id).addEventListener("change", route);
window.addEventListener("hashchange", route);
connect();
route();
