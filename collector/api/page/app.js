// The Argus page: jobs, and for the chosen job a rank x time heatmap of slowdown and its
// diagnoses, open and resolved, each its summary sentence first and its evidence behind a fold.
// A diagnosis with a stack capture (L5, evidence.stacks) shows its top frames and a flame graph
// (icicle: root on top) of one rank's stacks from that capture, the flagged rank first, its peer a
// click away; the stacks come folded from GET /jobs/{job}/stacks?capture=&rank=&format=collapsed.
// Times are ISO 8601 in the browser's zone (as the CLI prints them in its own). Plain DOM + SVG over
// the REST API; no build step.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 10000;
const SVG_NS = "http://www.w3.org/2000/svg";
const state = { job: null, flameRank: {} };
// Height of one frame of a flame graph, px; frames narrower than FLAME_MIN_SHARE of it are not drawn.
const FLAME_ROW_PX = 18;
const FLAME_MIN_SHARE = 0.002;

function $(id) { return document.getElementById(id); }

async function api(path) {
  const response = await fetch(API + path, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail; } catch (_) { /* not JSON */ }
    throw new Error(`${response.status} ${detail}`);
  }
  return response.json();
}

async function apiText(path) {
  const response = await fetch(API + path, { headers: { Accept: "text/plain" } });
  if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
  return response.text();
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

const pad = (n) => String(n).padStart(2, "0");

// ISO 8601 date and time in the browser's zone: 2026-12-01 14:03:07.
function when(ns) {
  if (ns == null) return "";
  const d = new Date(Number(ns) / 1e6);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(ns)}`;
}

function clock(ns) {
  const d = new Date(Number(ns) / 1e6);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function seconds(ns) {
  const s = Number(ns) / 1e9;
  return s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(1)} s`;
}

function jobFromHash() {
  const match = /(?:^#|&)job=([^&]*)/.exec(location.hash);
  return match ? decodeURIComponent(match[1]) : null;
}

async function loadJobs() {
  const page = await api("/jobs?limit=200");
  const body = $("jobs").querySelector("tbody");
  body.replaceChildren();
  for (const job of page.items) {
    const row = el(
      "tr",
      { "data-job": job.job_id },
      // At most two lines of the id (a long one would stand six lines tall); the whole id is the
      // tooltip, the job's heading and its link.
      el("td", { title: job.job_id }, el("div", { class: "job-id" }, job.job_id)),
      el("td", {}, el("span", { class: `status status-${job.status}` }, job.status)),
      el("td", {}, `${job.ranks_attached}/${job.world_size}`),
      el("td", {}, String(job.open_diagnoses)),
      el("td", { title: when(job.start_ns) }, job.start_ns == null ? "" : when(job.start_ns)),
    );
    if (job.job_id === state.job) row.classList.add("selected");
    row.addEventListener("click", () => { location.hash = "job=" + encodeURIComponent(job.job_id); });
    body.append(row);
  }
  $("jobs-empty").hidden = page.items.length > 0;
  return page.items;
}

// Slowdown percent -> fill: white at or below the median, through amber to red at +50% and more.
function color(pct) {
  if (pct == null) return "#f3f4f6";
  const t = Math.max(0, Math.min(1, pct / 50));
  const hue = 50 - 50 * t;
  const light = 96 - 50 * t;
  return `hsl(${hue}, 90%, ${light}%)`;
}

// The colour scale under the heatmap: what a cell's colour means.
function drawLegend() {
  const box = $("heatmap-legend");
  box.replaceChildren(el("span", {}, "slowdown vs the median rank:"));
  for (const pct of [0, 10, 20, 30, 40, 50]) {
    const swatch = el("span", { class: "swatch", style: `background: ${color(pct)}` });
    box.append(el("span", { class: "step", "data-pct": String(pct) }, swatch, pct === 50 ? "+50 % or more" : pct === 0 ? "0 % or less" : `+${pct} %`));
  }
  box.append(el("span", { class: "step" }, el("span", { class: "swatch", style: `background: ${color(null)}` }), "no data"));
  box.append(el("span", { class: "step" }, el("span", { class: "swatch span-open" }), "open diagnosis"));
  box.append(el("span", { class: "step" }, el("span", { class: "swatch span-resolved" }), "resolved diagnosis"));
}

function drawHeatmap(h, diagnoses = []) {
  const figure = $("heatmap");
  figure.replaceChildren();
  const rows = h.rows.length;
  const bins = h.times_ns.length;
  figure.dataset.rows = String(rows);
  figure.dataset.bins = String(bins);
  if (rows === 0 || bins === 0) {
    figure.setAttribute("viewBox", "0 0 400 30");
    figure.setAttribute("width", "400");
    const text = svg("text", { x: "0", y: "20" });
    text.textContent = "no timings in this range yet";
    figure.append(text);
    $("heatmap-caption").textContent = "";
    return;
  }
  const left = 70, top = 8, plotW = 860;
  const spanH = 5, spans = diagnoses.length;
  const bottom = 28 + spans * (spanH + 2);
  const cellW = plotW / bins;
  const cellH = Math.max(3, Math.min(18, 420 / rows));
  const width = left + plotW + 10, height = top + rows * cellH + bottom;
  figure.setAttribute("viewBox", `0 0 ${width} ${height}`);
  figure.setAttribute("width", "100%");
  figure.setAttribute("style", `max-width: ${width}px`);
  let worst = null;
  for (let i = 0; i < rows; i++) {
    const r = h.rows[i];
    const label = r.rank_lo === r.rank_hi ? `rank ${r.rank_lo}` : `ranks ${r.rank_lo}-${r.rank_hi}`;
    if (rows <= 40 || i % Math.ceil(rows / 40) === 0) {
      const text = svg("text", { x: String(left - 4), y: String(top + i * cellH + cellH * 0.75), "text-anchor": "end" });
      text.textContent = label;
      figure.append(text);
    }
    for (let j = 0; j < bins; j++) {
      const pct = h.slowdown_pct[i][j];
      const ms = h.dur_ms[i][j];
      const cell = svg("rect", {
        class: "cell",
        x: (left + j * cellW).toFixed(2),
        y: (top + i * cellH).toFixed(2),
        width: Math.max(cellW - 0.5, 0.5).toFixed(2),
        height: Math.max(cellH - 0.5, 0.5).toFixed(2),
        fill: color(pct),
        "data-rank-lo": String(r.rank_lo),
        "data-slowdown-pct": pct == null ? "" : String(pct),
      });
      const tip = svg("title");
      tip.textContent = pct == null ? `${label}: no data`
        : `${label} at ${clock(h.times_ns[j])}: ${ms} ms, ${pct >= 0 ? "+" : ""}${pct}% vs median`;
      cell.append(tip);
      figure.append(cell);
      if (pct != null && (worst == null || pct > worst.pct)) worst = { pct, label };
    }
  }
  for (const j of [0, Math.floor(bins / 2), bins - 1]) {
    const anchor = j === 0 ? "start" : j === bins - 1 ? "end" : "middle";
    const x = j === bins - 1 ? left + plotW : left + j * cellW;
    const text = svg("text", { x: String(x), y: String(top + rows * cellH + 16), "text-anchor": anchor });
    text.textContent = j === 0 ? clock(h.times_ns[0]) : `+${seconds(h.times_ns[j] - h.times_ns[0])}`;
    figure.append(text);
  }
  // Each diagnosis's span on the time axis, under the cells: from the start of its first window to the
  // start of its last (at least 3 px wide).
  const t0 = Number(h.times_ns[0]), t1 = Number(h.times_ns[bins - 1]) + Number(h.bin_ns);
  const xOf = (ns) => left + plotW * Math.max(0, Math.min(1, (Number(ns) - t0) / Math.max(t1 - t0, 1)));
  diagnoses.forEach((d, k) => {
    const x0 = xOf(d.first_window_ns), x1 = Math.max(xOf(d.last_window_ns), x0 + 3);
    const bar = svg("rect", {
      class: `span span-${d.state}`,
      x: x0.toFixed(2), y: String(top + rows * cellH + 22 + k * (spanH + 2)),
      width: (x1 - x0).toFixed(2), height: String(spanH),
      "data-id": d.id,
    });
    const tip = svg("title");
    tip.textContent = `${d.state} ${d.cause}: ${when(d.first_window_ns)} to ${when(d.last_window_ns)}`;
    bar.append(tip);
    figure.append(bar);
  });
  const metric = { busy: "busy time", step: "step time" }[h.metric] || `${h.metric} phase time`;
  $("heatmap-caption").textContent = `${metric}: slowdown against the median rank, ${seconds(h.bin_ns)} bins`
    + (worst ? `; worst ${worst.label} at +${worst.pct.toFixed(1)}%` : "");
}

function evidenceValue(value) {
  if (value !== null && typeof value === "object") return JSON.stringify(value);
  return String(value);
}

// Folded stacks ("thread;frame;...;frame count" per line, frames root to leaf) as a tree of
// {name, value, children}; Argus's own threads (argus-...) are left out, as the top frames leave them.
function foldedTree(text) {
  const root = { name: "all threads", value: 0, children: new Map() };
  for (const line of text.split("\n")) {
    const cut = line.lastIndexOf(" ");
    const count = Number(line.slice(cut + 1));
    if (cut <= 0 || !(count > 0)) continue;
    const path = line.slice(0, cut).split(";");
    if (path[0].startsWith("argus-")) continue;
    let node = root;
    root.value += count;
    for (const name of path) {
      let child = node.children.get(name);
      if (!child) {
        child = { name, value: 0, children: new Map() };
        node.children.set(name, child);
      }
      child.value += count;
      node = child;
    }
  }
  return root;
}

// "function (file:line)" -> "function" (a thread's name stays as it is).
function frameFunction(label) {
  return label.replace(/ \([^()]*:\d+\)$/, "");
}

// The icicle of one rank: one absolutely placed div per frame, its width the share of the samples
// whose stack holds it, its text the function's name (the whole frame in its tooltip). Frames that
// are among the diagnosis's top frames are marked.
function drawFlame(box, root, top) {
  box.replaceChildren();
  if (root.value === 0) {
    box.style.height = "auto";
    box.append(el("p", { class: "muted" }, "no stacks of this rank in the capture"));
    return;
  }
  let depth = 0;
  const place = (node, x, level) => {
    const share = node.value / root.value;
    if (share < FLAME_MIN_SHARE) return;
    depth = Math.max(depth, level + 1);
    const name = level === 0 ? node.name : frameFunction(node.name);
    const frame = el("div", {
      class: "frame" + (top.has(name) ? " top" : "") + (level === 1 ? " thread" : ""),
      style: `left: ${(100 * x).toFixed(3)}%; width: ${(100 * share).toFixed(3)}%; top: ${level * FLAME_ROW_PX}px`,
      title: `${node.name}: ${node.value} samples (${(100 * share).toFixed(1)} %)`,
      "data-function": name,
    }, name);
    box.append(frame);
    let at = x;
    const children = [...node.children.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    for (const child of children) {
      place(child, at, level + 1);
      at += child.value / root.value;
    }
  };
  place(root, 0, 0);
  box.style.height = `${depth * FLAME_ROW_PX}px`;
}

// Fetches and draws one rank's flame graph; a failed fetch says so in its place (never throws).
async function loadFlame(d, box, rank) {
  const s = d.evidence.stacks;
  const q = `capture=${encodeURIComponent(s.capture_id)}&rank=${rank}&format=collapsed`;
  box.dataset.rank = String(rank);
  try {
    const text = await apiText(`/jobs/${encodeURIComponent(d.job_id)}/stacks?${q}`);
    drawFlame(box, foldedTree(text), new Set((d.evidence.top_frames || []).map((f) => f.function)));
  } catch (err) {
    box.style.height = "auto";
    box.replaceChildren(el("p", { class: "muted" }, `stacks of rank ${rank}: ${err.message}`));
  }
}

// A diagnosis's stacks: its top frames, then the flame graph of the rank chosen (the flagged one
// first). Returns [the section, the promise of its flame graph], or null without a capture.
function stacksSection(d) {
  const s = d.evidence && d.evidence.stacks;
  if (!s || s.rank == null || !s.capture_id) return null;
  const ranks = s.peer != null ? [s.rank, s.peer] : [s.rank];
  const shown = ranks.includes(state.flameRank[d.id]) ? state.flameRank[d.id] : s.rank;
  const box = el("div", { class: "flame", "data-rank": String(shown) });
  const buttons = ranks.map((r) => el("button", { type: "button", "data-rank": String(r) },
    r === s.rank ? `rank ${r} (flagged)` : `rank ${r} (peer)`));
  const choose = (r) => {
    for (const b of buttons) b.classList.toggle("chosen", b.dataset.rank === String(r));
    state.flameRank[d.id] = r;
    return loadFlame(d, box, r);
  };
  for (const b of buttons) b.addEventListener("click", () => choose(Number(b.dataset.rank)));
  const versus = s.peer != null ? ` against rank ${s.peer}` : "";
  const top = el("ol", { class: "top-frames" });
  for (const f of d.evidence.top_frames || []) {
    top.append(el("li", {}, `${(100 * f.share).toFixed(1)} % `, el("code", {}, f.function), ` (${f.file}:${f.line})`,
      s.peer != null ? `, peer ${(100 * f.peer_share).toFixed(1)} %` : ""));
  }
  const frames = d.evidence.top_frames || [];
  const thread = s.thread ? `, thread ${s.thread}` : "";
  // Never an empty heading: without frames, the analyzer's reason takes the list's place.
  const heading = frames.length
    ? el("h5", {}, `Top frames of rank ${s.rank}${versus} (${s.sampler}${thread}, ${s.samples} samples; share of samples)`)
    : el("p", { class: "muted no-frames" }, `No top frames of rank ${s.rank}${versus} (${s.sampler}, ${s.samples} samples): `
      + (s.why_no_frames || "no line is held more often than in the peer's stacks"));
  const section = el("div", { class: "stacks", "data-capture": s.capture_id },
    heading,
    ...(frames.length ? [top] : []),
    el("div", { class: "flame-head" }, "flame graph (root on top) of ", ...buttons),
    box);
  return [section, choose(shown)];
}

// Draws the diagnoses; resolves once their flame graphs are drawn. The new ones replace the old
// only then, so a periodic refresh never shows an empty flame graph while its stacks load.
async function drawDiagnoses(items) {
  const shown = $("diagnoses");
  const box = document.createDocumentFragment();
  if (items.length === 0) {
    shown.replaceChildren(el("p", { class: "muted", id: "no-diagnoses" }, "No diagnoses: every rank is like its peers."));
    return;
  }
  const flames = [];
  // Open first, then resolved; newest first within each.
  const ordered = [...items].sort((a, b) => (a.state !== b.state ? (a.state === "open" ? -1 : 1)
    : Number(b.last_window_ns) - Number(a.last_window_ns)));
  for (const d of ordered) {
    const who = d.rank != null ? `rank ${d.rank}` : `ranks ${d.ranks.join(",")}`;
    const where = [d.phase && `phase ${d.phase}`, d.kernel && `kernel ${d.kernel}`, d.group && `group ${d.group}`]
      .filter(Boolean).join(", ");
    const facts = el("dl");
    const add = (k, v) => facts.append(el("dt", {}, k), el("dd", {}, v));
    add("score", `${d.score.toFixed(2)}: how far the rank stands from its peers `
      + "(0 = like them, 1 = the detection threshold, higher = further out)");
    if (d.group) add("group", `process group ${d.group}: the ranks this one was compared with`);
    add("slowdown", `${d.slowdown_pct.toFixed(1)} % of throughput`);
    add("seen", `${when(d.first_window_ns)} to ${when(d.last_window_ns)}`);
    const evidence = el("dl");
    for (const [k, v] of Object.entries(d.evidence)) evidence.append(el("dt", {}, k), el("dd", {}, evidenceValue(v)));
    // The timeline of the ranks involved (and rank 0 as a reference) over the diagnosis's windows.
    const ranks = [...new Set([0, ...d.ranks])].join(",");
    const trace = `${API}/jobs/${encodeURIComponent(d.job_id)}/trace?start=${d.first_window_ns}`
      + `&end=${d.last_window_ns + 60e9}&ranks=${ranks}`;
    const stacks = stacksSection(d);
    if (stacks) flames.push(stacks[1]);
    box.append(el(
      "article",
      { class: `diagnosis diagnosis-${d.state}`, "data-id": d.id, "data-cause": d.cause, "data-state": d.state },
      el("h4", {}, el("span", { class: `state state-${d.state}` }, d.state), ` ${d.cause}: ${who}${where ? " (" + where + ")" : ""}`),
      el("p", { class: "summary" }, d.summary || ""),
      facts,
      ...(stacks ? [stacks[0]] : []),
      el("details", {}, el("summary", {}, "all evidence"), evidence),
      el("a", { href: trace }, "timeline of these ranks (Chrome trace JSON)"),
    ));
  }
  await Promise.all(flames);
  shown.replaceChildren(box);
}

async function loadJob(jobId) {
  const metric = $("metric").value;
  const q = encodeURIComponent(jobId);
  const [job, heat, diagnoses] = await Promise.all([
    api(`/jobs/${q}`),
    api(`/jobs/${q}/heatmap?metric=${metric}&bins=60&max_rows=128`),
    api(`/jobs/${q}/diagnoses?limit=100`),
  ]);
  const open = diagnoses.items.filter((d) => d.state === "open").length;
  const resolved = diagnoses.items.length - open;
  $("job-panel").hidden = false;
  $("job-title").textContent = `Job ${job.job_id}`;
  const link = `${location.origin}${location.pathname}#job=${encodeURIComponent(job.job_id)}`;
  $("job-link").href = link;
  $("job-link").textContent = link;
  $("job-summary").textContent = `${job.status}, ${job.ranks_attached} of ${job.world_size} ranks attached on `
    + `${job.hosts} host(s), ${job.ranks_exited} exited (${job.ranks_failed} failed); last seen ${when(job.last_seen_ns)}`
    + `; ${open} open and ${resolved} resolved diagnoses`
    + (job.status === "finished" && resolved > 0 ? " (resolved when the job finished or the fault stopped)" : "");
  $("trace-link").href = `${API}/jobs/${q}/trace?max_events=200000`;
  drawHeatmap(heat, diagnoses.items);
  drawLegend();
  await drawDiagnoses(diagnoses.items);
}

async function refresh() {
  try {
    const jobs = await loadJobs();
    state.job = jobFromHash() || (jobs.length ? jobs[0].job_id : null);
    for (const row of $("jobs").querySelectorAll("tbody tr")) {
      row.classList.toggle("selected", row.dataset.job === state.job);
    }
    if (state.job) await loadJob(state.job);
    $("updated").textContent = "updated " + clock(Date.now() * 1e6);
    document.body.dataset.loaded = "true";
  } catch (err) {
    $("updated").textContent = "error: " + err.message;
    document.body.dataset.loaded = "error";
  }
}

window.addEventListener("hashchange", refresh);
$("metric").addEventListener("change", refresh);
refresh();
setInterval(refresh, REFRESH_MS);
