// flowsim web page: plain JavaScript over the /v1 API (no build step).
"use strict";

const $ = (id) => document.getElementById(id);
const TOKEN_KEY = "flowsim-token";
const POLL_MS = 1000; // jobs list refresh while the page is open
const COMPONENTS = [["compute_s", "compute"], ["tp_comm_s", "TP comm"], ["cp_comm_s", "CP comm"],
  ["ep_comm_s", "EP comm"], ["pp_comm_s", "PP comm"], ["dp_comm_s", "DP comm"], ["bubble_s", "bubble"],
  ["optimizer_s", "optimizer"]];
const COLORS = ["#3b6ea5", "#e07b39", "#8e5ea2", "#3ba58c", "#c94f7c", "#d1b531", "#8c8c8c", "#5aa0d6"];
let shownJob = null;

function token() { return $("token").value.trim(); }

async function api(method, path, body) {
  const opts = { method, headers: { Authorization: "Bearer " + token() } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  const type = r.headers.get("content-type") || "";
  const data = type.includes("json") ? await r.json() : await r.text();
  if (!r.ok) throw new Error((data && data.error) || r.status + " " + r.statusText);
  return data;
}

function fill(select, values, preferred) {
  select.innerHTML = "";
  for (const v of values) {
    const o = document.createElement("option");
    o.value = o.textContent = v;
    select.appendChild(o);
  }
  if (values.includes(preferred)) select.value = preferred;
}

async function loadPresets() {
  const p = await api("GET", "/v1/presets");
  fill($("model"), p.models, "llama3-70b");
  fill($("cluster"), p.clusters, "dgx-h100");
  fill($("precision"), p.precisions, "bf16");
  fill($("recompute"), p.recompute, "none");
}

function jobConfig() {
  const c = { model: $("model").value, cluster: $("cluster").value, precision: $("precision").value };
  for (const k of ["gpus", "gbs", "seq"]) if ($(k).value) c[k] = Number($(k).value);
  return c;
}

function estimateConfig() {
  const c = jobConfig();
  for (const k of ["tp", "pp", "vpp", "cp", "mbs"]) if ($(k).value) c[k] = Number($(k).value);
  c.recompute = $("recompute").value;
  c.sp = $("sp").checked;
  c.distributed_optimizer = $("distributed_optimizer").checked;
  return c;
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "-";
  if (typeof x !== "number") return String(x);
  return Math.abs(x) >= 1e5 ? x.toExponential(digits) : Number(x.toPrecision(digits + 1)).toString();
}

function bars(canvas, labels, values, unit) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const max = Math.max(...values, 1e-12);
  const rowH = Math.min(24, (canvas.height - 10) / Math.max(labels.length, 1));
  ctx.font = "12px sans-serif";
  labels.forEach((label, i) => {
    const y = 5 + i * rowH;
    const w = (canvas.width - 230) * values[i] / max;
    ctx.fillStyle = COLORS[i % COLORS.length];
    ctx.fillRect(110, y, w, rowH - 4);
    ctx.fillStyle = "#222";
    ctx.fillText(label, 4, y + rowH / 2 + 2);
    ctx.fillText(fmt(values[i]) + " " + unit, 114 + w, y + rowH / 2 + 2);
  });
}

// points: [x, y] pairs; front: pairs drawn on top in orange and joined (tune's Pareto front)
function scatter(canvas, points, xLabel, yLabel, front = []) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (!points.length) return;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const L = 60, B = canvas.height - 30, W = canvas.width - L - 10, H = B - 10;
  const px = (x) => L + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * W;
  const py = (y) => B - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * H;
  ctx.strokeStyle = "#999";
  ctx.strokeRect(L, 10, W, H);
  ctx.fillStyle = "#3b6ea5";
  for (const [x, y] of points) { ctx.beginPath(); ctx.arc(px(x), py(y), 3, 0, 2 * Math.PI); ctx.fill(); }
  if (front.length) {
    ctx.strokeStyle = ctx.fillStyle = "#e07b39";
    ctx.beginPath();
    front.forEach(([x, y], i) => (i ? ctx.lineTo(px(x), py(y)) : ctx.moveTo(px(x), py(y))));
    ctx.stroke();
    for (const [x, y] of front) { ctx.beginPath(); ctx.arc(px(x), py(y), 4, 0, 2 * Math.PI); ctx.fill(); }
    ctx.fillText("Pareto front", L + W - 80, 24);
  }
  ctx.fillStyle = "#222";
  ctx.font = "12px sans-serif";
  ctx.fillText(xLabel + " (" + fmt(x0) + " .. " + fmt(x1) + ")", L, canvas.height - 8);
  ctx.save(); ctx.translate(12, B); ctx.rotate(-Math.PI / 2);
  ctx.fillText(yLabel + " (" + fmt(y0) + " .. " + fmt(y1) + ")", 0, 0); ctx.restore();
}

function table(el, rows, columns) {
  if (!rows.length) { el.textContent = "(no rows)"; return; }
  const cols = columns || Object.keys(rows[0]).filter((k) => k !== "key" && typeof rows[0][k] !== "object");
  let html = "<table><thead><tr>" + cols.map((c) => "<th>" + c + "</th>").join("") + "</tr></thead><tbody>";
  for (const r of rows) html += "<tr>" + cols.map((c) => "<td>" + fmt(r[c]) + "</td>").join("") + "</tr>";
  el.innerHTML = html + "</tbody></table>";
}

function showEstimate(r) {
  $("estimate-result").hidden = false;
  const fig = [["step time", fmt(r.step_time_s) + " s"], ["tokens/s", fmt(r.tokens_per_s)],
    ["MFU", (100 * r.mfu).toFixed(1) + " %"], ["TFLOP/s per GPU", r.tflops_per_gpu.toFixed(1)],
    ["memory per GPU", r.memory_gb_per_gpu.toFixed(1) + " of " + r.memory_capacity_gb.toFixed(0) + " GB"],
    ["fits in memory", r.fits_memory ? "yes" : "NO"]];
  $("figures").innerHTML = fig.map(([k, v]) => "<div>" + k + "<b>" + v + "</b></div>").join("");
  const parts = COMPONENTS.filter(([k]) => r.breakdown[k] > 0);
  bars($("breakdown"), parts.map(([, n]) => n), parts.map(([k]) => r.breakdown[k]), "s");
  const mem = Object.entries(r.memory_detail_gb || {});
  table($("memory"), mem.map(([what, gb]) => ({ what, GB: gb })), ["what", "GB"]);
}

async function estimate(ev) {
  ev.preventDefault();
  $("error").textContent = "";
  try { showEstimate(await api("POST", "/v1/estimate", estimateConfig())); }
  catch (e) { $("error").textContent = e.message; }
}

async function submitJob(body) {
  $("error").textContent = "";
  try { await api("POST", "/v1/jobs", body); await refreshJobs(); }
  catch (e) { $("error").textContent = e.message; }
}

async function refreshJobs() {
  if (!token()) return;
  let page;
  try { page = await api("GET", "/v1/jobs?limit=20"); } catch (e) { return; }
  const tbody = $("jobs-table").querySelector("tbody");
  tbody.innerHTML = "";
  for (const j of page.jobs) {
    const tr = document.createElement("tr");
    tr.dataset.job = j.id;
    tr.innerHTML = "<td>" + j.id.slice(0, 8) + "</td><td>" + j.kind + "</td><td class='state state-" + j.state + "'>" +
      j.state + "</td><td><progress max='1' value='" + j.progress + "'></progress></td><td>" +
      new Date(j.created_s * 1000).toLocaleTimeString() + "</td><td>" + fmt(j.run_s) + "</td><td></td>";
    if (j.state === "done") {
      const b = document.createElement("button");
      b.textContent = "view";
      b.className = "view";
      b.onclick = () => showJob(j);
      tr.lastChild.appendChild(b);
    } else if (j.state === "failed") {
      tr.lastChild.textContent = j.message || "";
    }
    tbody.appendChild(tr);
  }
}

function plotJob(kind, result) {
  const canvas = $("job-plot");
  const stepMem = (p) => [p.step_time_s, p.memory_bytes_per_gpu / 1e9];
  if (kind === "tune") scatter(canvas, (result.ranked || []).map(stepMem), "step time s", "memory GB",
    (result.pareto || []).map(stepMem));
  else if (kind === "sweep") bars(canvas, result.points.map((p) => p.hardware + " " + (p.workload || "")),
    result.points.map((p) => p.step_time_s || 0), "s");
  else if (kind === "collective") scatter(canvas, result.rows.map((r) => [Math.log2(r.size_bytes), r.busbw_Bps / 1e9]),
    "log2 size B", "busbw GB/s");
  else if (kind === "validate") scatter(canvas, result.rows.map((r) => [r.measured_step_time_s, r.predicted_step_time_s]),
    "measured s", "predicted s");
  else if (kind === "estimate") {
    const parts = COMPONENTS.filter(([k]) => result.breakdown[k] > 0);
    bars(canvas, parts.map(([, n]) => n), parts.map(([k]) => result.breakdown[k]), "s");
  }
}

function rowsOf(kind, result) {
  return { estimate: result.stages, tune: result.ranked, sweep: result.points }[kind] || result.rows ||
    result.parameters || [];
}

async function download(path, name) {
  const r = await fetch(path, { headers: { Authorization: "Bearer " + token() } });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(await r.blob());
  a.download = name;
  a.click();
}

async function showJob(j) {
  shownJob = j.id;
  const res = await api("GET", "/v1/jobs/" + j.id + "/result");
  $("job-result").hidden = false;
  $("job-id").textContent = j.id.slice(0, 8) + " (" + j.kind + ")";
  plotJob(j.kind, res.result);
  table($("job-table"), rowsOf(j.kind, res.result));
  $("dl-json").onclick = (e) => { e.preventDefault(); download("/v1/jobs/" + j.id + "/result", j.kind + "-" + j.id + ".json"); };
  $("dl-csv").onclick = (e) => { e.preventDefault(); download("/v1/jobs/" + j.id + "/result?format=csv", j.kind + "-" + j.id + ".csv"); };
}

function init() {
  $("token").value = localStorage.getItem(TOKEN_KEY) || "";
  $("token").addEventListener("change", () => { localStorage.setItem(TOKEN_KEY, token()); loadPresets().catch((e) => { $("error").textContent = e.message; }); });
  $("form").addEventListener("submit", estimate);
  $("submit-job").addEventListener("click", () => submitJob({ kind: "estimate", config: estimateConfig() }));
  $("submit-tune").addEventListener("click", () => submitJob({ kind: "tune", config: jobConfig(),
    space: { max_vpp: 2, max_cp: 1, max_mbs: 2 } }));
  if (token()) loadPresets().catch((e) => { $("error").textContent = e.message; });
  setInterval(refreshJobs, POLL_MS);
}

init();
