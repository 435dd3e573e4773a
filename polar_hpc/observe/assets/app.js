// The dashboard page: polls the JSON APIs and draws them. Text from the run (messages, log lines,
// task ids) is untrusted: it only ever goes into the page as textContent, never as HTML.
"use strict";
const TOKEN = new URLSearchParams(location.search).get("token") || "";
const STAGE_COLORS = {QUEUED: "#bbb", ASSIGNED: "#9ad", INIT: "#e9a23b", READY: "#c6c", RUN: "#4a8", POSTRUN: "#57c"};
let filter = "";

async function api(path) {
  const r = await fetch(path, {headers: {Authorization: "Bearer " + TOKEN}});
  if (!r.ok) throw new Error(path + ": " + r.status + " " + (await r.text()));
  return r.json();
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}

const $ = (id) => document.getElementById(id);
const set = (id, v) => { $(id).textContent = v; };
const fmt = (x, d = 0) => x === null || x === undefined ? "-" : Number(x).toLocaleString("en-US", {maximumFractionDigits: d});
const pairs = (o) => Object.entries(o || {}).map(([k, v]) => k + " " + v).join(", ") || "none";
function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.round(s);
  return s >= 3600 ? Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m"
    : s >= 60 ? Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s" : s + "s";
}

function table(id, head, rows) {
  const t = $(id);
  t.replaceChildren(el("tr", {}, ...head.map((h) => el("th", {}, h))),
    ...rows.map((r) => el("tr", r.attrs || {}, ...r.cells.map((c) => el("td", {}, c)))));
}

function chart(svg, series, opts = {}) {
  // series: [{points: [[x, y]...], color}]; one shared scale; axes labelled with min/max.
  const W = 460, H = 150, L = 44, B = 18;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  const all = series.flatMap((s) => s.points);
  if (!all.length) { svg.append(svgEl("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty"}, "no data yet")); return; }
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs) || 1, y0 = Math.min(0, ...ys), y1 = Math.max(...ys, opts.ymax || 0) || 1;
  const X = (x) => L + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - L - 6), Y = (y) => H - B - (y - y0) / (y1 - y0 || 1) * (H - B - 6);
  svg.append(svgEl("line", {x1: L, y1: H - B, x2: W, y2: H - B, class: "axis"}), svgEl("line", {x1: L, y1: 0, x2: L, y2: H - B, class: "axis"}),
    svgEl("text", {x: L - 4, y: 10, "text-anchor": "end"}, fmt(y1, 2)), svgEl("text", {x: L - 4, y: H - B, "text-anchor": "end"}, fmt(y0, 2)),
    svgEl("text", {x: L, y: H - 3}, new Date(x0 * 1000).toISOString().slice(11, 19)),
    svgEl("text", {x: W, y: H - 3, "text-anchor": "end"}, new Date(x1 * 1000).toISOString().slice(11, 19)));
  for (const s of series) {
    if (!s.points.length) continue;
    const d = s.points.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join("");
    svg.append(svgEl("path", {d, stroke: s.color, fill: "none", "stroke-width": 1.6}));
    if (s.points.length === 1) svg.append(svgEl("circle", {cx: X(s.points[0][0]), cy: Y(s.points[0][1]), r: 2.5, fill: s.color}));
  }
}

function svgEl(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawOverview(o) {
  set("run-dir", o.run_dir);
  set("state", o.state);
  $("state").className = "badge " + o.state;
  set("done", o.done); set("total", o.total);
  $("progress-bar").style.width = (o.total ? 100 * o.done / o.total : 0) + "%";
  set("eta", o.state === "finished" ? "done" : duration(o.eta_s));
  set("rate", fmt(o.sessions_per_s * 60, 1));
  set("tokens", o.tokens); set("trainable", o.trainable_tokens); set("tokens-rate", fmt(o.tokens_per_s, 1));
  set("calls", o.calls); set("chain-breaks", o.chain_breaks); set("requeues", o.requeues);
  set("by-status", pairs(o.by_status)); set("versions", pairs(o.weight_versions));
  const a = o.accounting;
  set("cost-text", a && typeof a.gpu_hours === "number" ? fmt(a.gpu_hours, 3) + " GPU-hours, " + fmt(a.cpu_hours, 3) +
    " CPU-hours; " + (a.gpu_hours_per_accepted == null ? "no accepted trajectory" : fmt(a.gpu_hours_per_accepted, 4) +
    " GPU-hours per accepted trajectory") : "not known (run `polar-hpc status` for a Slurm run)");
  set("errors-total", o.errors_total);
  table("stages", Object.keys(o.stages), [{cells: Object.values(o.stages)}]);
  table("stage-seconds", ["stage", "n", "mean", "max"], Object.entries(o.stage_seconds).map(([k, v]) =>
    ({cells: [k, v.n, fmt(v.mean, 2), fmt(v.max, 2)]})));
  table("tasks", ["task", "ended", "rewarded", "mean", "min", "max"], o.tasks.map((t) =>
    ({attrs: {"data-task": t.task_id}, cells: [t.task_id, pairs(t.by_status), t.reward.n, fmt(t.reward.mean, 3), fmt(t.reward.min, 3), fmt(t.reward.max, 3)]})));
  table("jobs", ["job", "kind", "last word"], (o.jobs || []).map((j) =>
    ({cells: [j.job, j.kind, j.event === "end" ? "ended: " + j.outcome : j.event === "start" ? "running" : j.event]})));
  table("gateways", ["gateway", "host", "slots", "up", "since (UTC)"], o.gateways.map((g) =>
    ({cells: [g.name, g.host, g.slots ?? "", g.up ? "up" : "lost", new Date(g.since * 1000).toISOString().slice(11, 19)]})));
  table("processes", ["process", "errors", "log changed", "last line"], o.processes.map((p) =>
    ({cells: [p.name, p.errors, duration(Date.now() / 1000 - p.changed) + " ago",
      el("span", {title: p.last_line}, p.last_line.length > 70 ? p.last_line.slice(0, 70) + "…" : p.last_line)]})));
  set("updated", "updated " + new Date().toISOString().slice(11, 19) + " UTC");
}

function drawSeries(s) {
  const pts = s.points;
  chart($("chart-throughput"), [{points: pts.map((p) => [p.t, p.ended]), color: "#4a8"}]);
  chart($("chart-reward"), [{points: pts.filter((p) => p.rewarded).map((p) => [p.t, p.reward_sum / p.rewarded]), color: "#c63"}]);
  chart($("chart-tokens"), [{points: pts.filter((p) => p.tokens).map((p) => [p.t, p.tokens]), color: "#57c"},
    {points: pts.filter((p) => p.tokens).map((p) => [p.t, p.trainable]), color: "#e9a23b"}]);
  const stages = Object.keys(STAGE_COLORS);
  chart($("chart-stages"), stages.map((k) => ({points: pts.filter((p) => p.stages && k in p.stages).map((p) => [p.t, p.stages[k]]), color: STAGE_COLORS[k]})));
  const live = s.live || [], timed = live.filter((p) => p.engine_ms !== null);
  chart($("chart-latency"), [{points: timed.map((p) => [p.t, p.engine_ms]), color: "#57c"},
    {points: timed.map((p) => [p.t, p.proxy_ms]), color: "#c63"}]);
  chart($("chart-engine"), [{points: live.map((p) => [p.t, p.running]), color: "#4a8"},
    {points: live.map((p) => [p.t, p.waiting]), color: "#e9a23b"}]);
  $("stage-legend").replaceChildren(...stages.map((k) => el("span", {style: "color:" + STAGE_COLORS[k]}, "■ " + k + " ")));
}

function drawErrors(e) {
  const block = (list) => list.map((k) => el("details", {class: "error"},
    el("summary", {}, el("b", {}, k.count + "×"), " " + k.kind), el("pre", {}, k.examples.join("\n"))));
  $("errors").replaceChildren(...(e.errors.length ? block(e.errors) : [el("p", {}, "none")]));
  $("breaks").replaceChildren(...(e.chain_breaks.length ? block(e.chain_breaks) : [el("p", {}, "none")]));
}

async function loadTrajectories() {
  const r = await api("/api/trajectories?limit=200&" + filter);
  set("matched", r.matched + (r.kept < r.seen ? ` (latest ${r.kept} of ${r.seen} kept)` : ""));
  table("trajectories", ["task", "sample", "status", "reward", "traces", "calls", "tokens", "trainable", "chain breaks", "session"],
    r.rows.map((t) => ({attrs: {"data-id": t.id, class: "row", onclick: () => openTrajectory(t.id)},
      cells: [t.task_id, t.sample_index, t.status, fmt(t.reward, 3), t.traces, t.calls, t.tokens, t.trainable, t.chain_breaks, t.session_id]})));
}

function messageText(m) {
  let c = m.content;
  if (Array.isArray(c)) c = c.map((p) => p.text ?? JSON.stringify(p)).join("\n");
  let text = c === null || c === undefined ? "" : typeof c === "string" ? c : JSON.stringify(c);
  for (const call of m.tool_calls || []) text += "\n→ " + (call.function?.name || "tool") + "(" + (call.function?.arguments || "") + ")";
  return text;
}

async function openTrajectory(id) {
  const t = await api("/api/trajectory/" + id);
  $("detail").hidden = false;
  set("detail-session", t.session_id);
  $("detail-meta").replaceChildren(el("p", {}, `task ${t.task_id} · sample ${t.sample_index} · attempt ${t.attempt} · ${t.status} · reward ${fmt(t.reward, 3)} · ` +
    `${t.traces.length} trace(s) · ${t.decoded ? "decoded with the run's tokenizer" : "token ids (no tokenizer found)"}`),
    el("details", {}, el("summary", {}, "metadata"), el("pre", {}, JSON.stringify(t.metadata, null, 1))));
  const breaks = t.metadata.chain_breaks || [];
  const parts = [];
  t.traces.forEach((tr, i) => {
    if (i > 0 && t.metadata.builder === "per_request") parts.push(el("div", {class: "next-call"}, "next call (per_request builder: one trace per call)"));
    else if (i > 0) parts.push(el("div", {class: "chain-break"}, "⚡ chain break: " + (breaks[i - 1] || "a new chain started")));
    const chat = el("div", {class: "chat"}, ...tr.messages.map((m) => el("div", {class: "msg " + (m.role || "")},
      el("div", {class: "role"}, m.role || "?"), el("div", {class: "content"}, messageText(m)))));
    const toks = el("div", {class: "tokens", "data-trace": i}, ...tr.tokens.map(([id, text, mask, lp], j) => el("span", {
      class: j < tr.prompt_tokens ? "tok prompt" : mask ? "tok trainable" : "tok env",
      "data-mask": j < tr.prompt_tokens ? "" : mask, "data-id": id, "data-logprob": lp === null ? "" : lp,
    }, text === null ? id + " " : text)));
    parts.push(el("div", {class: "trace"},
      el("h3", {}, `trace ${i}: ${tr.prompt_tokens} prompt + ${tr.response_tokens} response tokens, ${tr.trainable} trainable · calls ${tr.call_indices.join(", ")} · versions ${tr.weight_versions.join(", ")} · finish ${tr.finish_reason}` + (tr.hidden ? ` · ${tr.hidden} tokens not shown` : "")),
      el("div", {class: "legend"}, el("span", {class: "tok prompt"}, "prompt"), " ", el("span", {class: "tok env"}, "environment (mask 0)"), " ", el("span", {class: "tok trainable"}, "trainable (mask 1)")),
      el("details", {open: ""}, el("summary", {}, "conversation"), chat),
      el("details", {open: ""}, el("summary", {}, "tokens"), toks)));
  });
  $("detail-traces").replaceChildren(...parts);
  $("detail").scrollIntoView();
}

document.addEventListener("mouseover", (ev) => {
  const tip = $("tip"), t = ev.target;
  if (!(t instanceof HTMLElement) || !t.classList.contains("tok") || !t.dataset.id) { tip.hidden = true; return; }
  tip.textContent = `id ${t.dataset.id}` + (t.dataset.logprob !== "" ? ` · logprob ${t.dataset.logprob}` : "") +
    (t.dataset.mask !== "" ? ` · mask ${t.dataset.mask}` : " · prompt");
  tip.style.left = ev.pageX + 10 + "px"; tip.style.top = ev.pageY + 14 + "px"; tip.hidden = false;
});
$("close-detail").addEventListener("click", () => { $("detail").hidden = true; });
$("filter").addEventListener("submit", (ev) => {
  ev.preventDefault();
  filter = new URLSearchParams([...new FormData(ev.target)].filter(([, v]) => v !== "")).toString();
  loadTrajectories().catch(showError);
});

function showError(e) { set("updated", String(e)); $("updated").className = "failed"; }

async function refresh() {
  try {
    const [o, s, e] = await Promise.all([api("/api/overview"), api("/api/series"), api("/api/errors")]);
    drawOverview(o); drawSeries(s); drawErrors(e);
    await loadTrajectories();
    $("updated").className = "";
    document.body.dataset.loaded = "1";
  } catch (e) { showError(e); }
}
refresh();
setInterval(refresh, 3000);
