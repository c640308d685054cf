// The agiledart dashboard: polls /api/state every second and redraws. No framework, no
// network beyond this peer; every string from the cluster goes in as text, never markup.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
const COLOURS = ["#d53f8c", "#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#319795", "#c53030"];
// the token in the URL is only a way in: the page's answer set the dashboard's cookie,
// so take the token out of the address bar and the history at once
const token = new URLSearchParams(location.search).get("token") || "";
if (token) history.replaceState(null, "", location.pathname);
const rateHistory = new Map(); // app id -> [{t, in, out}], for live rates
let selected = null; // the peer whose leaf set is highlighted
let last = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function fmt(x, digits = 1) {
  if (x === null || x === undefined || Number.isNaN(x)) return "-";
  if (Math.abs(x) >= 1e6) return (x / 1e6).toFixed(digits) + "M";
  if (Math.abs(x) >= 1e4) return (x / 1e3).toFixed(digits) + "k";
  return Number(x).toFixed(digits);
}

function angleOf(nodeId) {
  return (parseInt(String(nodeId).slice(0, 8) || "0", 16) / 2 ** 32) * 2 * Math.PI;
}

// -- ring ----------------------------------------------------------------------------

function drawRing(state) {
  const ring = document.getElementById("ring");
  ring.replaceChildren();
  const c = 210, r = 140;
  ring.append(svg("circle", { cx: c, cy: c, r, fill: "none", stroke: "#d9dde3", "stroke-width": 2 }));
  const at = new Map();
  for (const p of state.peers) {
    const a = angleOf(p.node_id) - Math.PI / 2;
    at.set(p.name, [c + r * Math.cos(a), c + r * Math.sin(a), a]);
  }
  if (!selected || !at.has(selected)) selected = state.peer;
  for (const p of state.peers) {
    const from = at.get(p.name);
    for (const n of p.leaf_set) {
      const to = at.get(n);
      if (!from || !to) continue;
      const strong = p.name === selected;
      ring.append(svg("line", {
        x1: from[0], y1: from[1], x2: to[0], y2: to[1], class: "leaf",
        stroke: strong ? "#4a5568" : "#e2e8f0", "stroke-width": strong ? 2 : 1,
      }));
    }
  }
  state.apps.forEach((app, i) => {
    if (app.state !== "running" && app.state !== "deploying") return;
    const colour = COLOURS[i % COLOURS.length];
    for (const path of app.paths || []) {
      const points = path.map((n) => at.get(n)).filter(Boolean);
      if (points.length < 2) continue;
      ring.append(svg("polyline", {
        points: points.map((q) => q[0] + "," + q[1]).join(" "), fill: "none",
        stroke: colour, "stroke-width": 2.5, "stroke-opacity": 0.8, class: "join-path",
        "data-app": app.app_id,
      }));
    }
  });
  const labels = []; // placed label positions: neighbours' labels step outwards
  for (const p of state.peers) {
    const [x, y, a] = at.get(p.name);
    let out = r + 22;
    while (labels.some(([qx, qy]) => Math.hypot(qx - (c + out * Math.cos(a)), qy - (c + out * Math.sin(a))) < 14)) out += 14;
    labels.push([c + out * Math.cos(a), c + out * Math.sin(a)]);
    const g = svg("g", { class: "ring-peer", "data-peer": p.name });
    g.append(svg("circle", {
      cx: x, cy: y, r: p.name === selected ? 8 : 6,
      fill: !p.reachable ? "#c53030" : p.self ? "#2b6cb0" : "#4a5568",
    }));
    const [lx, ly] = labels[labels.length - 1];
    g.append(svg("text", {
      x: lx, y: ly + 4, "font-size": 11,
      "text-anchor": Math.cos(a) > 0.3 ? "start" : Math.cos(a) < -0.3 ? "end" : "middle",
    }, p.name));
    g.addEventListener("click", () => { selected = p.name; render(last); });
    ring.append(g);
  }
  document.getElementById("ring-count").textContent =
    `${state.peers.length} peers shown, ${state.peers_known} known to ${state.peer}`;
}

function drawPeers(state) {
  const body = document.querySelector("#peers tbody");
  body.replaceChildren();
  for (const p of state.peers) {
    const row = el("tr", { "data-peer": p.name },
      el("td", {}, p.name + (p.self ? " (this peer)" : "")),
      el("td", {}, p.zone),
      el("td", {}, p.address),
      el("td", {}, p.rtt_ms === null || p.rtt_ms === undefined ? "" : fmt(p.rtt_ms)),
      el("td", { class: "small" }, p.leaf_set.join(", ")),
      el("td", { class: "small" }, p.apps.join(", ")));
    if (p.name === selected) row.classList.add("selected");
    if (!p.reachable) row.classList.add("down");
    row.addEventListener("click", () => { selected = p.name; render(last); });
    body.append(row);
  }
}

function drawZones(state) {
  const box = document.getElementById("zones");
  box.replaceChildren();
  for (const [zone, names] of Object.entries(state.zones)) {
    box.append(el("div", { class: "zone", "data-zone": zone },
      el("b", {}, `zone ${zone}: `), names.join(", ")));
  }
  const sched = Object.entries(state.schedulers);
  box.append(el("div", { class: "muted small" }, sched.length
    ? "schedulers of live apps: " + sched.map(([n, k]) => `${n} (${k})`).join(", ")
    : "no live apps, so no scheduler at work"));
}

// -- apps ----------------------------------------------------------------------------

function rates(app, now) {
  const t = app.totals || {};
  const h = rateHistory.get(app.app_id) || [];
  if (!h.length || h[h.length - 1].t !== now) h.push({ t: now, in: t.source_records || 0, out: t.sink_records || 0 });
  while (h.length > 60) h.shift();
  rateHistory.set(app.app_id, h);
  const out = [];
  for (let i = 1; i < h.length; i++) {
    const dt = h[i].t - h[i - 1].t;
    if (dt > 0) out.push({ in: (h[i].in - h[i - 1].in) / dt, out: (h[i].out - h[i - 1].out) / dt });
  }
  return out;
}

function sparkline(series) {
  const w = 180, hgt = 36;
  const s = svg("svg", { width: w, height: hgt, class: "spark", viewBox: `0 0 ${w} ${hgt}` });
  const top = Math.max(1, ...series.map((p) => Math.max(p.in, p.out)));
  for (const [key, colour] of [["in", "#2b6cb0"], ["out", "#38a169"]]) {
    if (series.length < 2) break;
    const pts = series.map((p, i) => [(i / (series.length - 1)) * w, hgt - 2 - (p[key] / top) * (hgt - 4)]);
    s.append(svg("polyline", { points: pts.map((q) => q.join(",")).join(" "), fill: "none", stroke: colour, "stroke-width": 1.5 }));
  }
  return s;
}

function drawGraph(graph) {
  const W = 190, H = 70, GX = 60, GY = 18;
  const columns = new Map();
  for (const n of graph.nodes) {
    if (!columns.has(n.layer)) columns.set(n.layer, []);
    columns.get(n.layer).push(n);
  }
  const layers = Math.max(0, ...graph.nodes.map((n) => n.layer)) + 1;
  const rows = Math.max(1, ...[...columns.values()].map((c) => c.length));
  const width = layers * (W + GX) + 10, height = rows * (H + GY) + 10;
  const s = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "dataflow" });
  const pos = new Map();
  for (const [layer, nodes] of columns) {
    const offset = ((rows - nodes.length) * (H + GY)) / 2;
    nodes.forEach((n, i) => pos.set(n.id, [10 + layer * (W + GX), 10 + offset + i * (H + GY)]));
  }
  for (const [a, b] of graph.edges) {
    const pa = pos.get(a), pb = pos.get(b);
    if (!pa || !pb) continue;
    const x1 = pa[0] + W, y1 = pa[1] + H / 2, x2 = pb[0] - 6, y2 = pb[1] + H / 2;
    const mid = (x1 + x2) / 2;
    s.append(svg("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`, class: "edge", "data-edge": `${a}>${b}` }));
    s.append(svg("polygon", { points: `${x2},${y2 - 4} ${x2 + 6},${y2} ${x2},${y2 + 4}`, class: "arrow" }));
  }
  for (const n of graph.nodes) {
    const [x, y] = pos.get(n.id);
    const g = svg("g", { class: `node ${n.kind}`, "data-node": n.id, "data-kind": n.kind, "data-peers": n.peers.join(",") });
    g.append(svg("rect", { x, y, width: W, height: H, rx: 5 }));
    g.append(svg("text", { x: x + 8, y: y + 16, class: "title" }, n.id));
    g.append(svg("text", { x: x + 8, y: y + 31 }, `${n.kind}${n.op ? ": " + n.op : ""}`));
    g.append(svg("text", { x: x + 8, y: y + 46, class: "peers" }, "@ " + (n.peers.join(", ") || "?")));
    if (n.load) {
      g.append(svg("text", { x: x + 8, y: y + 61 },
        `${fmt(n.load.rate)}/s  q ${fmt(n.load.queued, 0)}  rho ${fmt(n.load.utilization, 2)}`));
    }
    s.append(g);
  }
  return s;
}

function drawApps(state) {
  const box = document.getElementById("apps");
  box.replaceChildren();
  document.getElementById("apps-count").textContent = `(${state.apps.length})`;
  if (!state.apps.length) box.append(el("p", { class: "muted" }, "no apps: submit one with `agiledart submit`"));
  for (const app of state.apps) {
    const t = app.totals || {};
    const series = rates(app, state.generated_at);
    const now = series.length ? series[series.length - 1] : { in: null, out: null };
    const live = app.state === "running" || app.state === "deploying";
    const card = el("section", { class: "app", "data-app-id": app.app_id, "data-state": app.state },
      el("h3", {}, `${app.name} `, el("span", { class: "muted" }, app.app_id), " ",
        el("span", { class: `badge ${app.state}`, "data-role": "state" }, app.state)),
      el("div", { class: "muted small" }, `scheduler ${app.scheduler || "?"}`),
      app.error ? el("div", { class: "error" }, app.error) : null,
      el("div", { class: "figures" },
        el("span", { class: "figure" }, el("b", {}, live ? fmt(now.in) : "-"), " in/s"),
        el("span", { class: "figure" }, el("b", {}, live ? fmt(now.out) : "-"), " out/s"),
        el("span", { class: "figure" }, el("b", {}, fmt(t.latency_p50_ms)), " ms p50"),
        el("span", { class: "figure" }, el("b", {}, fmt(t.latency_p99_ms)), " ms p99"),
        el("span", { class: "figure" }, `${fmt(t.source_records, 0)} in, ${fmt(t.sink_records, 0)} out`),
        el("span", { class: `figure${t.errors ? " error" : ""}`, "data-role": "errors" }, `${fmt(t.errors || 0, 0)} errors`),
        sparkline(series)));
    const problems = Object.entries(app.problems || {});
    if (problems.length) {
      const list = el("ul", { class: "problems", "data-role": "problems" });
      for (const [op, p] of problems) {
        for (const e of p.recent || []) {
          list.append(el("li", { class: "error" },
            `${op}: ${e.count || 1} \u00d7 ${e.type}: ${e.message}` + (e.peer ? ` on ${e.peer}` : "") +
            (e.record ? ` (e.g. ${e.record})` : "")));
        }
        if (p.dead_letters) {
          list.append(el("li", { class: "dead-letters" },
            `${op}: ${fmt(p.dead_letters, 0)} sent to its dead-letter sink`));
        }
        for (const [peer, d] of Object.entries(p.dead_letter_sinks || {})) {
          const where = d.path ? `: ${d.path}` : "";
          const trouble = d.problem
            ? ` (${d.error || d.last_error || d.connection || "trouble"}${d.lost ? `, ${d.lost} lost` : ""})`
            : "";
          list.append(el("li", { class: d.problem ? "error" : "dead-letters" },
            `${op}: dead letters on ${peer}${where}${trouble}`));
        }
      }
      card.append(list);
    }
    if (app.graph && app.graph.nodes.length) card.append(el("div", { class: "graph" }, drawGraph(app.graph)));
    if (app.paths && app.paths.length) {
      const list = el("ol", { class: "paths" });
      for (const p of app.paths) list.append(el("li", { class: "join-path" }, "JOIN path: " + p.join(" \u2192 ")));
      card.append(list);
    }
    box.append(card);
  }
}

function drawEvents(state) {
  const list = document.getElementById("events");
  list.replaceChildren();
  for (const e of [...state.events].reverse()) {
    const when = new Date(e.t * 1000).toLocaleTimeString();
    list.append(el("li", {}, `${when}  ${e.text}`));
  }
}

function render(state) {
  if (!state) return;
  document.getElementById("peer").textContent = `seen from ${state.peer}`;
  document.getElementById("updated").textContent = new Date(state.generated_at * 1000).toLocaleTimeString();
  drawRing(state);
  drawPeers(state);
  drawZones(state);
  drawApps(state);
  drawEvents(state);
  document.body.dataset.updated = String(state.generated_at);
}

function setStatus(text, cls) {
  const badge = document.getElementById("status");
  badge.textContent = text;
  badge.className = `badge ${cls}`;
}

async function poll() {
  try {
    const headers = token ? { Authorization: "Bearer " + token } : {}; // else the cookie
    const res = await fetch("/api/state", { headers, credentials: "same-origin", cache: "no-store" });
    if (res.status === 401 || res.status === 403) {
      setStatus(res.status === 401 ? "token needed" : "wrong token", "error");
      return; // no point asking again
    }
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    last = await res.json();
    render(last);
    setStatus("live", "ok");
  } catch (err) {
    setStatus(`unreachable (${err.message})`, "unreachable");
  }
  setTimeout(poll, POLL_MS);
}

poll();
