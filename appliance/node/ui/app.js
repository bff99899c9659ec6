// ctxpod dashboard: polls the node's API with the token given to it and draws with plain
// SVG. No dependency, no inline code (the page's Content-Security-Policy forbids it).
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(500, Number(params.get("refresh")) || 2000);
const HISTORY = 150;
const state = { token: sessionStorage.getItem("ctxpod-token"), prev: null, history: [],
  timer: null, polls: 0, capacityBlocks: 0 };

class AuthError extends Error {}

// ---- formatting ------------------------------------------------------------------------
const SI = ["B", "kB", "MB", "GB", "TB", "PB"];
function bytes(n) {
  if (!Number.isFinite(n)) return "–";
  let i = 0;
  while (Math.abs(n) >= 1000 && i < SI.length - 1) { n /= 1000; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(n >= 100 ? 0 : n >= 10 ? 1 : 2)) + " " + SI[i];
}
const rate = (n) => bytes(n) + "/s";
const int = (n) => Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "–";
const ratio = (x) => Number.isFinite(x) ? x.toFixed(3) : "–";
function secs(s) {
  if (!Number.isFinite(s)) return "–";
  if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1e3).toFixed(s < 1e-2 ? 2 : 1) + " ms";
  return s.toFixed(2) + " s";
}
function setText(id, text) { const e = $(id); if (e.textContent !== text) e.textContent = text; }
function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function svgEl(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---- API ---------------------------------------------------------------------------------
async function api(path, opts = {}) {
  const headers = Object.assign({ Accept: "application/json" }, opts.headers || {});
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const r = await fetch(path, Object.assign({}, opts, { headers, cache: "no-store" }));
  let body = null;
  try { body = await r.json(); } catch (_) { /* not JSON */ }
  if (r.status === 401) throw new AuthError("the node did not accept this token");
  if (r.status === 403) {
    throw new AuthError("this token may not see the pod: give an admin or a viewer token");
  }
  if (!r.ok) {
    const e = new Error(body && body.message ? body.message : "HTTP " + r.status);
    e.status = r.status;
    throw e;
  }
  return body;
}

// ---- theme -------------------------------------------------------------------------------
function applyTheme(t) {
  if (t) document.documentElement.dataset.theme = t;
}
applyTheme(localStorage.getItem("ctxpod-theme"));
function toggleTheme() {
  const dark = getComputedStyle(document.documentElement).colorScheme.includes("dark");
  const next = dark ? "light" : "dark";
  localStorage.setItem("ctxpod-theme", next);
  applyTheme(next);
}

// ---- sign-in -----------------------------------------------------------------------------
function showLogin(message) {
  stop();
  $("main").hidden = true;
  $("login").hidden = false;
  $("signout").hidden = true;
  setText("login-error", message || "");
}
function showMain() {
  $("login").hidden = true;
  $("main").hidden = false;
  $("signout").hidden = document.body.dataset.auth !== "on";
}
function stop() { if (state.timer) { clearInterval(state.timer); state.timer = null; } }
async function start() {
  showMain();
  state.prev = null;
  state.history = [];
  state.polls = 0;
  await poll();
  if (!$("main").hidden) state.timer = setInterval(poll, REFRESH_MS);
}

// ---- the overview ------------------------------------------------------------------------
// Sum of a counter over the members that answered.
const sum = (stats, f) => stats.reduce((a, s) => a + (f(s) || 0), 0);

// p99 of the requests of `ops` between two readings, from the latency histograms.
function p99(now, before, ops) {
  const bounds = (now[0] && now[0].latency_bounds_s) || [];
  const counts = new Array(bounds.length).fill(0);
  let total = 0;
  const add = (stats, sign) => {
    for (const s of stats) {
      for (const h of s.latency || []) {
        if (!ops.includes(h.op)) continue;
        total += sign * h.count;
        h.buckets.forEach((c, i) => { counts[i] += sign * c; });
      }
    }
  };
  add(now, 1);
  add(before, -1);
  if (total <= 0) return null;
  const want = 0.99 * total;
  const i = counts.findIndex((c) => c >= want);
  return i < 0 ? Infinity : bounds[i];
}

function renderOverview(o) {
  const t = performance.now();
  const up = o.members.filter((m) => m.health === "ok");
  const stats = up.map((m) => m.stats).filter(Boolean);
  setText("node", "· " + o.node_id + " · " + o.source + (o.etcd_up ? "" : " (etcd down)"));
  setText("m-nodes", up.length + " / " + o.members.length);
  const cap = sum(stats, (s) => s.capacity_bytes);
  const used = sum(stats, (s) => s.used_bytes);
  setText("m-capacity", bytes(cap));
  setText("m-used", bytes(used) + (cap > 0 ? " (" + (100 * used / cap).toFixed(1) + " %)" : ""));
  setText("m-blocks", int(sum(stats, (s) => s.block_count)));
  const hits = sum(stats, (s) => s.hits), misses = sum(stats, (s) => s.misses);
  const life = hits + misses > 0 ? hits / (hits + misses) : NaN;
  const integrity = sum(stats, (s) => s.integrity_errors);
  setText("m-integrity", int(integrity));
  $("m-integrity").className = "value " + (integrity > 0 ? "bad" : "ok");
  const dev = sum(stats, (s) => s.device_written_bytes);
  const user = sum(stats, (s) => s.user_written_bytes);
  setText("m-endurance", (cap > 0 ? (dev / cap).toFixed(4) : "–") + " · " +
    (user > 0 ? (dev / user).toFixed(2) + "×" : "–"));

  // Rates and percentiles between this reading and the last, per member that answered
  // both (a member that restarted starts over).
  const prev = state.prev;
  let win = null;
  if (prev) {
    const pairs = [];
    for (const m of up) {
      const b = prev.byId[m.id];
      if (m.stats && b && m.stats.uptime_s >= b.uptime_s) pairs.push([m.stats, b]);
    }
    const dt = (t - prev.t) / 1000;
    const d = (f) => pairs.reduce((a, [n, b]) => a + (f(n) - f(b)), 0);
    const now = pairs.map((p) => p[0]), before = pairs.map((p) => p[1]);
    win = {
      read: d((s) => s.sent_bytes) / dt,
      written: d((s) => s.received_bytes) / dt,
      hits: d((s) => s.hits),
      misses: d((s) => s.misses),
      get: p99(now, before, ["get", "batch_get"]),
      put: p99(now, before, ["put", "batch_put"]),
    };
  }
  const hitNow = win && win.hits + win.misses > 0 ? win.hits / (win.hits + win.misses) : NaN;
  setText("m-hit", ratio(hitNow) + " / " + ratio(life));
  if (win) {
    setText("m-bw", rate(win.read) + " · " + rate(win.written));
    const p = (x) => x === null ? "–" : x === Infinity ? "> 2.6 s" : "≤ " + secs(x);
    setText("m-p99", p(win.get) + " · " + p(win.put));
    state.history.push({ read: win.read, written: win.written });
    if (state.history.length > HISTORY) state.history.shift();
    drawBandwidth();
  }
  state.prev = { t, byId: Object.fromEntries(up.filter((m) => m.stats).map((m) => [m.id, m.stats])) };

  const rows = o.members.map((m) => {
    const s = m.stats;
    const tr = el("tr", { "data-node": m.id });
    const cells = [
      [m.id], [m.zone], [m.state],
      [m.health, m.health === "ok" ? "ok" : "bad"],
      [s ? bytes(s.used_bytes) + " / " + bytes(s.capacity_bytes) : "–", "num"],
      [s ? int(s.block_count) : "–", "num"],
      [s && s.hits + s.misses > 0 ? ratio(s.hits / (s.hits + s.misses)) : "–", "num"],
      [s ? int(s.integrity_errors) : "–", "num " + (s && s.integrity_errors > 0 ? "bad" : "")],
      [s && s.capacity_bytes > 0 ? (s.device_written_bytes / s.capacity_bytes).toFixed(4) : "–", "num"],
      [s ? s.io_engine + (s.direct_io ? ", O_DIRECT" : "") : "–"],
    ];
    for (const [text, cls] of cells) tr.appendChild(el("td", cls ? { class: cls } : {}, text));
    return tr;
  });
  $("members").tBodies[0].replaceChildren(...rows);

  // Each member's flash tiers (one "device" on a node of one): use, traffic since its
  // start, moves between tiers, the share of the drive's rated lifetime writes used, and
  // the reads each tier served (and their share of the member's flash hits).
  const tiers = up.filter((m) => m.stats && m.stats.tiers).flatMap((m) => m.stats.tiers.map((t) => {
    const tr = el("tr", { "data-node": m.id, "data-tier": t.name });
    const flashHits = m.stats.tiers.reduce((a, x) => a + (x.hits || 0), 0);
    const cells = [
      [m.id], [t.name],
      [bytes(t.used_bytes) + " / " + bytes(t.capacity_bytes), "num"],
      [int(t.regions_free) + " / " + int(t.regions_total), "num"],
      [bytes(t.read_bytes), "num"], [bytes(t.written_bytes), "num"],
      [bytes(t.moved_out_bytes), "num"],
      [t.rated_written_bytes ? (100 * t.written_bytes / t.rated_written_bytes).toPrecision(2) + " %" : "–", "num"],
      [int(t.hits || 0) + (flashHits ? " (" + Math.round(100 * (t.hits || 0) / flashHits) + " %)" : ""), "num"],
    ];
    for (const [text, cls] of cells) tr.appendChild(el("td", cls ? { class: cls } : {}, text));
    return tr;
  }));
  $("tiers").tBodies[0].replaceChildren(...tiers);

  const ns = o.namespaces.map((n) => {
    const tr = el("tr", { "data-ns": n.name });
    tr.appendChild(el("td", {}, n.name));
    // weights are never evicted: what of the capacity they hold is not a cache.
    tr.appendChild(el("td", { "data-class": n.class || "kv" }, n.class || "kv"));
    tr.appendChild(el("td", { class: "num", "data-value": n.block_count }, int(n.block_count)));
    tr.appendChild(el("td", { class: "num", "data-value": n.used_bytes }, bytes(n.used_bytes)));
    tr.appendChild(el("td", { class: "num" }, n.quota_bytes == null ? "none" : bytes(n.quota_bytes)));
    tr.appendChild(el("td", { class: "num" }, String(n.replication || o.replication)));
    return tr;
  });
  $("namespaces").tBodies[0].replaceChildren(...ns);
}

// ---- charts ------------------------------------------------------------------------------
const W = 640, PAD = { l: 62, r: 16, t: 14, b: 34 };

// A line chart: series of [x, y] (x log-scaled when `logx`), y from 0 to `ymax`.
function lineChart(svg, series, o) {
  const H = Number(svg.getAttribute("viewBox").split(" ")[3]);
  const pts = series.flatMap((s) => s.points);
  const kids = [];
  const xs = pts.map((p) => p[0]).concat((o.marks || []).map((m) => m.x * 1.25));
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (!(x1 > x0)) x1 = x0 + 1;
  const lx = (x) => (o.logx ? Math.log10(Math.max(x, 1e-9)) : x);
  const X = (x) => PAD.l + (W - PAD.l - PAD.r) * (lx(x) - lx(x0)) / (lx(x1) - lx(x0));
  const ymax = o.ymax || Math.max(1e-9, ...pts.map((p) => p[1])) * 1.1;
  const Y = (y) => H - PAD.b - (H - PAD.t - PAD.b) * y / ymax;
  kids.push(svgEl("line", { class: "axis", x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b }));
  kids.push(svgEl("line", { class: "axis", x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b }));
  for (let i = 0; i <= 4; i++) {
    const y = ymax * i / 4;
    kids.push(svgEl("text", { x: PAD.l - 6, y: Y(y) + 4, "text-anchor": "end" }, o.yfmt(y)));
  }
  const ticks = o.logx
    ? Array.from({ length: 5 }, (_, i) => 10 ** (lx(x0) + (lx(x1) - lx(x0)) * i / 4))
    : Array.from({ length: 5 }, (_, i) => x0 + (x1 - x0) * i / 4);
  ticks.forEach((x, i) => kids.push(svgEl("text", {
    x: X(x), y: H - PAD.b + 16, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle",
  }, o.xfmt(x))));
  if (o.xlabel) kids.push(svgEl("text", { x: W - PAD.r, y: H - 4, "text-anchor": "end" }, o.xlabel));
  for (const m of o.marks || []) {
    kids.push(svgEl("line", { class: "mark", x1: X(m.x), y1: PAD.t, x2: X(m.x), y2: H - PAD.b }));
    kids.push(svgEl("text", { x: X(m.x) + 4, y: PAD.t + 10 }, m.label));
  }
  series.forEach((s, i) => {
    if (s.points.length === 0) return;
    const d = s.points.map((p, j) => (j ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1)).join(" ");
    kids.push(svgEl("path", { class: s.cls, d, id: s.id, "data-points": s.points.length }));
    if (s.label) {
      kids.push(svgEl("text", { x: PAD.l + 8 + 150 * i, y: PAD.t + 10, class: "legend" + (i + 1) }, "— " + s.label));
    }
  });
  svg.replaceChildren(...kids);
}

function drawBandwidth() {
  const h = state.history;
  lineChart($("bw-chart"), [
    { points: h.map((p, i) => [i, p.read]), cls: "s1", label: "read", id: "bw-read" },
    { points: h.map((p, i) => [i, p.written]), cls: "s2", label: "written", id: "bw-written" },
  ], {
    yfmt: rate,
    xfmt: (x) => x >= h.length - 1 ? "now" : "-" + Math.round((h.length - 1 - x) * REFRESH_MS / 1000) + " s",
  });
}

async function pollMrc() {
  try {
    const c = await api("/v1/mrc?scope=pod");
    state.capacityBlocks = c.capacity_blocks;
    setText("mrc-note", "The pod's LRU hit ratio by capacity, from " + int(c.references) +
      " block references (" + (c.sample_rate * 100).toFixed(2) + " % of keys sampled, " +
      int(c.tracked_keys) + " tracked; " + c.references_per_s.toFixed(1) +
      " references/s); the line marks the pod's capacity now (" + int(c.capacity_blocks) +
      " blocks of " + bytes(c.mean_block_bytes) + ").");
    lineChart($("mrc-chart"), [{
      points: c.points.map((p) => [p.capacity_blocks, p.hit_ratio]), cls: "s1", id: "mrc-line",
    }], {
      logx: true, ymax: 1, yfmt: (y) => y.toFixed(2), xfmt: (x) => int(x),
      xlabel: "capacity (blocks)", marks: [{ x: c.capacity_blocks, label: "capacity now" }],
    });
  } catch (e) {
    if (e instanceof AuthError) throw e;
    setText("mrc-note", "No curve: " + e.message);
  }
}

async function poll() {
  try {
    const o = await api("/v1/overview");
    renderOverview(o);
    if (state.polls % 5 === 0) await pollMrc();
    state.polls++;
    setText("status", "updated " + new Date().toLocaleTimeString());
  } catch (e) {
    if (e instanceof AuthError) showLogin(e.message);
    else setText("status", "not updated: " + e.message);
  }
}

// ---- the planner ---------------------------------------------------------------------------
const PLAN_ROWS = [
  ["KV bytes per token", "kv_bytes_per_token", int],
  ["Block", "block_bytes", bytes],
  ["Blocks a request", "blocks_per_request", int],
  ["Hit ratio", "hit_ratio", ratio],
  ["Capacity (blocks, one copy)", "capacity_blocks", int],
  ["Capacity (all copies)", "capacity_bytes", bytes],
  ["Read", "read_bytes_per_s", rate],
  ["Written (all copies)", "write_bytes_per_s", rate],
  ["Nodes", "nodes", int],
  ["Bound by", "bound_by", String],
  ["Drive writes per day", "dwpd", (x) => x.toFixed(3)],
  ["Drive lifetime (years)", "drive_lifetime_years", (x) => Number.isFinite(x) ? x.toFixed(1) : "∞"],
  ["Prefill tokens saved/s", "prefill_tokens_saved_per_s", int],
  ["GPUs saved", "gpus_saved", (x) => x.toFixed(2)],
];

// With a fast tier (`fast_drive`): each tier's size, hits and wear (`plan.tiers`).
const TIER_ROWS = [
  ["Fast tier (blocks, one copy)", "fast_capacity_blocks", int],
  ["Fast tier (all copies)", "fast_capacity_bytes", bytes],
  ["Dense tier (all copies)", "dense_capacity_bytes", bytes],
  ["Hit ratio from fast", "fast_hit_ratio", ratio],
  ["Hit ratio from dense", "dense_hit_ratio", ratio],
  ["Fast drive writes per day", "fast_dwpd", (x) => x.toFixed(2)],
  ["Fast drive lifetime (years)", "fast_lifetime_years", (x) => Number.isFinite(x) ? x.toFixed(1) : "∞"],
];

function planBody(form) {
  const f = new FormData(form);
  const num = (k) => { const v = f.get(k); return v === null || v === "" ? undefined : Number(v); };
  const body = {
    model: f.get("model"), tokens_per_block: num("tokens_per_block"), rate: num("rate"),
    input_tokens: num("input_tokens"), target_hit_ratio: num("target_hit_ratio"),
    retention_s: num("retention_s"), drive: f.get("drive"), drives: num("drives"),
    nics: num("nics"), nic_gbps: num("nic_gbps"), replication: num("replication"),
  };
  if (f.get("reuse") === "live") body.live = true; else body.sharing = num("sharing");
  if (f.get("fast_drive")) {
    body.fast_drive = f.get("fast_drive");
    body.fast_drives = num("fast_drives");
    body.fast_hit_share = num("fast_hit_share");
  }
  for (const k of Object.keys(body)) if (body[k] === undefined) delete body[k];
  return body;
}

async function submitPlan(ev) {
  ev.preventDefault();
  setText("plan-error", "");
  try {
    const r = await api("/v1/plan", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(planBody(ev.target)),
    });
    renderPlan(r);
  } catch (e) {
    if (e instanceof AuthError) return showLogin(e.message);
    $("plan-out").hidden = true;
    setText("plan-error", e.message);
  }
}

function renderPlan(r) {
  const p = r.plan;
  const rows = PLAN_ROWS.map(([label, key, fmt]) => {
    const tr = el("tr");
    tr.appendChild(el("td", {}, label));
    tr.appendChild(el("td", { class: "num", id: "plan-" + key, "data-value": String(p[key]) }, fmt(p[key])));
    return tr;
  });
  const t = p.tiers;
  if (t) {
    for (const [label, key, fmt] of TIER_ROWS) {
      const tr = el("tr");
      tr.appendChild(el("td", {}, label));
      const v = t[key] === null ? Infinity : t[key];
      tr.appendChild(el("td", { class: "num", id: "plan-tiers-" + key, "data-value": String(t[key]) }, fmt(v)));
      rows.push(tr);
    }
  }
  $("plan-result").tBodies[0].replaceChildren(...rows);
  $("plan-notes").replaceChildren(...p.notes.map((n) => el("li", {}, n)));
  $("plan-out").hidden = false;
  // Nodes for each bound, as bars.
  const bounds = [["capacity", p.nodes_for_capacity], ["read", p.nodes_for_read], ["write", p.nodes_for_write]];
  const top = Math.max(1e-9, ...bounds.map((b) => b[1]));
  const kids = bounds.flatMap(([name, n], i) => {
    const w = (W - 180) * n / top, y = 20 + i * 44;
    return [
      svgEl("text", { x: 10, y: y + 20 }, name),
      svgEl("rect", { class: "bar" + (name === p.bound_by ? " top" : ""), x: 90, y, width: Math.max(1, w), height: 28, "data-nodes": n }),
      svgEl("text", { x: 96 + w, y: y + 20 }, n.toFixed(2)),
    ];
  });
  $("plan-chart").replaceChildren(...kids);
  // The reuse curve, when the plan came from one.
  const c = r.input.reuse.curve;
  $("plan-curve-fig").hidden = !c;
  if (c) {
    const scale = r.input.requests_per_s / c.at_requests_per_s;
    lineChart($("plan-curve"), [{
      points: c.points.filter((q) => q[0] > 0).map((q) => [q[0] * scale, q[1]]), cls: "s1", id: "plan-curve-line",
    }], {
      logx: true, ymax: 1, yfmt: (y) => y.toFixed(2), xfmt: (x) => int(x),
      xlabel: "capacity (blocks)", marks: [{ x: p.capacity_blocks, label: "planned" }],
    });
  }
}

// ---- wiring ------------------------------------------------------------------------------
$("theme").addEventListener("click", toggleTheme);
$("signout").addEventListener("click", () => {
  sessionStorage.removeItem("ctxpod-token");
  state.token = null;
  showLogin("");
});
$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = $("token").value.trim();
  sessionStorage.setItem("ctxpod-token", state.token);
  $("token").value = "";
  start();
});
$("plan-form").addEventListener("submit", submitPlan);
if (document.body.dataset.auth === "on" && !state.token) showLogin("");
else start();
