// clusterctl dashboard: one Server-Sent Events stream (api/stream) brings the hosts, the runs and the endpoints
// every few seconds, and the selected run's curves; the page redraws in place, never reloads. Every text from the
// cluster (host names, run ids, models, a model's answers) goes into the page as text, never as HTML.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];
const OUTCOME = {ok: "finished", failed: "failed", stopped: "stopped", running: "running", unknown: "unknown"};

let selected = null;        // the run shown
let pinned = false;         // the user chose it (else the newest running run, or the newest run, is followed)
let stream = null;
let charts = {};
const conversations = {};  // endpoint run id -> [{role, content}]

function api(path, params) {
  const query = new URLSearchParams(Object.assign({token: TOKEN}, params || {}));
  return `api/${path}?${query}`;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

const num = (x, digits) => (x === null || x === undefined) ? "-" : Number(x).toFixed(digits);

function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.round(s);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
}

function replaceRows(table, rows) {
  const body = document.querySelector(`#${table} tbody`);
  body.replaceChildren(...rows);
}

// -- hosts ----------------------------------------------------------------------------------------------------
function renderHosts(doc) {
  const hosts = doc.hosts || [];
  document.getElementById("hosts-note").textContent = doc.picture.nodes.length
    ? (doc.hosts_taken ? `sampled ${new Date(doc.hosts_taken * 1000).toLocaleTimeString()}` : "sampling every host…")
    : "no inventory given (clusterctl dashboard --hosts inventory.yaml shows the hosts)";
  document.getElementById("hosts").hidden = !doc.picture.nodes.length;
  replaceRows("hosts", hosts.map((h) => el("tr", {
    "class": h.state !== "ok" && h.state !== "sampling" ? "down" : (h.flags && h.flags.length ? "flagged" : ""),
    "data-host": h.host}, ...h.cells.map((c) => el("td", {}, c)))));
  drawPicture(doc.picture, Object.fromEntries(hosts.map((h) => [h.host, h])));
}

function drawPicture(picture, byName) {
  const root = document.getElementById("picture");
  const nodes = picture.nodes;
  if (!nodes.length) { root.replaceChildren(); root.style.display = "none"; return; }
  root.style.display = "";
  // this machine at the top; the hosts on an ellipse below it, in inventory order (two: left and right)
  const at = {"this machine": [210, 24]};
  nodes.forEach((n, i) => {
    const a = -Math.PI / 2 + Math.PI / nodes.length + 2 * Math.PI * i / nodes.length;
    at[n.id] = nodes.length === 1 ? [210, 190] : [210 + 145 * Math.cos(a), 185 + 80 * Math.sin(a)];
  });
  const parts = [];
  for (const link of picture.links) {
    const [x1, y1] = at[link.a], [x2, y2] = at[link.b];
    parts.push(svg("line", {x1, y1, x2, y2, "class": link.kind}));
    if (link.kind === "data" && link.label)
      parts.push(svg("text", {x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, "class": "label"}, link.label));
  }
  const box = (id, lines, cls) => {
    const [x, y] = at[id];
    const g = svg("g", {"class": cls || ""});
    g.append(svg("rect", {x: x - 55, y: y - 18, width: 110, height: 18 + 12 * lines.length, rx: 5}));
    g.append(svg("text", {x, y: y - 4, "font-weight": "bold"}, id));
    lines.forEach((line, i) => g.append(svg("text", {x, y: y + 9 + 12 * i}, line)));
    return g;
  };
  parts.push(box("this machine", ["clusterctl"]));
  for (const n of nodes) {
    const h = byName[n.id] || {};
    const cls = h.state && h.state !== "ok" && h.state !== "sampling" ? "down" : (h.flags && h.flags.length ? "flagged" : "");
    parts.push(box(n.id, [n.address || n.ssh, h.state === "ok" ? (h.flags && h.flags.length ? h.flags.join(", ") : "ok") : (h.state || "")], cls));
  }
  root.replaceChildren(...parts);
}

// -- runs -----------------------------------------------------------------------------------------------------
function renderRuns(runs) {
  replaceRows("runs", runs.map((run) => {
    const row = el("tr", {"data-run-id": run.run_id, "class": run.run_id === selected ? "selected" : ""},
      el("td", {"class": "mono"}, run.run_id), el("td", {}, run.kind || "-"),
      el("td", {}, run.model ? run.model.split("/").pop() : "-"), el("td", {}, run.start ? run.start.replace("T", " ").slice(0, 19) : "-"),
      el("td", {}, duration(run.duration_s)), el("td", {}, (run.hosts || []).join(", ")),
      el("td", {}, run.status === "ok" ? "finished" : run.outcome), el("td", {}, num(run.final_loss, 3)),
      el("td", {}, num(run.final_val_loss, 3)));
    row.addEventListener("click", () => { pinned = true; select(run.run_id); });
    return row;
  }));
  if (!pinned) {
    const running = runs.find((r) => r.status === "running");
    const follow = running ? running.run_id : (runs[0] ? runs[0].run_id : null);
    if (follow && follow !== selected) select(follow);
  }
}

function select(runId) {
  if (runId === selected) return;
  selected = runId;
  document.querySelectorAll("#runs tbody tr").forEach((tr) => tr.classList.toggle("selected", tr.dataset.runId === runId));
  document.getElementById("run-id").textContent = runId;
  connect();
}

function renderRun(doc) {
  const status = document.getElementById("run-status");
  const note = document.getElementById("run-note");
  if (doc.error) { note.textContent = doc.error; return; }
  const run = doc.run;
  if (run.run_id !== selected) return;
  const label = OUTCOME[run.status] || run.status;
  status.textContent = label;
  status.className = `status ${label}`;
  note.textContent = [run.kind, run.model, run.strategy, run.backend, `${run.world || "?"} rank(s)`,
                      run.status === "running" ? `running ${duration(Date.now() / 1000 - Date.parse(run.start) / 1000)}` : run.outcome]
    .filter(Boolean).join(" · ");
  replaceRows("ranks", doc.ranks.map((r) => el("tr", {},
    el("td", {}, r.rank >= 0 ? r.rank : "all"), el("td", {}, r.host),
    el("td", {}, r.step === null || r.step === undefined ? "-" : (r.total_steps ? `${r.step}/${r.total_steps}` : r.step)),
    el("td", {}, num(r.loss, 3)), el("td", {}, num(r.tokens_per_s, 0)),
    el("td", {}, r.share === null || r.share === undefined ? "-" : `${(100 * r.share).toFixed(0)}%`))));
  const name = (r) => (r.rank >= 0 ? `rank ${r.rank}` : "all ranks");
  chart("loss-chart", doc.ranks.map((r) => [name(r), r.curve.filter((p) => p.loss !== undefined).map((p) => [p.step, p.loss])])
    .concat(doc.held_out.length ? [["held-out", doc.held_out]] : []));
  chart("speed-chart", doc.ranks.map((r) => [name(r), r.curve.filter((p) => p.tokens_per_s !== undefined).map((p) => [p.step, p.tokens_per_s])]));
  const stacks = document.getElementById("stacks");
  if (doc.stacks) {
    stacks.replaceChildren(el("h3", {}, `stacks taken ${doc.stacks.taken}`),
      ...Object.entries(doc.stacks.ranks).map(([rank, text]) => el("details", {open: ""}, el("summary", {}, `rank ${rank}`), el("pre", {}, text))));
  } else stacks.replaceChildren();
}

// series: [[name, [[step, value], ...]], ...] drawn as one uPlot chart, x the union of their steps
function chart(id, series) {
  const box = document.getElementById(id);
  series = series.filter(([, points]) => points.length);
  const steps = [...new Set(series.flatMap(([, points]) => points.map((p) => p[0])))].sort((a, b) => a - b);
  const columns = series.map(([, points]) => {
    const byStep = new Map(points);
    return steps.map((s) => (byStep.has(s) ? byStep.get(s) : null));
  });
  box.dataset.points = String(series.reduce((n, [, points]) => n + points.length, 0));
  const names = series.map(([name]) => name).join("|");
  const data = [steps, ...columns];
  const old = charts[id];
  if (old && old.names === names) { old.plot.setData(data); return; }
  if (old) old.plot.destroy();
  box.replaceChildren();
  if (!series.length) { delete charts[id]; return; }
  const opts = {
    width: Math.max(320, box.clientWidth || 480), height: 220,
    scales: {x: {time: false}},
    legend: {live: false},
    axes: [{label: "step"}, {}],
    series: [{label: "step"}, ...series.map(([name], i) => ({
      label: name, stroke: name === "held-out" ? "#111" : COLOURS[i % COLOURS.length],
      dash: name === "held-out" ? [6, 4] : undefined, width: name === "held-out" ? 2 : 1.5, spanGaps: true,
      points: {show: name === "held-out"}}))],
  };
  charts[id] = {names, plot: new uPlot(opts, data, box)};
}

// -- endpoints and the chat box -------------------------------------------------------------------------------
function renderEndpoints(endpoints) {
  document.getElementById("endpoints-note").hidden = endpoints.length > 0;
  document.getElementById("endpoints").hidden = endpoints.length === 0;
  replaceRows("endpoints", endpoints.map((e) => el("tr", {"data-run-id": e.run_id},
    el("td", {"class": "mono"}, e.run_id), el("td", {}, e.model || "-"), el("td", {"class": "mono"}, e.url),
    el("td", {}, e.healthy === null || e.healthy === undefined ? "checking…" : (e.healthy ? "healthy" : "not answering")))));
  const form = document.getElementById("chat");
  form.hidden = endpoints.length === 0;
  const choice = document.getElementById("chat-endpoint");
  const current = choice.value;
  const ids = endpoints.map((e) => e.run_id).join("|");
  if (choice.dataset.ids !== ids) {
    choice.replaceChildren(...endpoints.map((e) => el("option", {value: e.run_id}, `${e.model || "model"} (${e.run_id})`)));
    choice.dataset.ids = ids;
    if (endpoints.some((e) => e.run_id === current)) choice.value = current;
  }
}

function say(cls, text) {
  const log = document.getElementById("chat-log");
  log.append(el("p", {"class": cls}, text));
  log.scrollTop = log.scrollHeight;
}

document.getElementById("chat").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("chat-input");
  const endpoint = document.getElementById("chat-endpoint").value;
  const text = input.value.trim();
  if (!text || !endpoint) return;
  input.value = "";
  const messages = (conversations[endpoint] = conversations[endpoint] || []);
  messages.push({role: "user", content: text});
  say("user", text);
  const send = document.getElementById("chat-send");
  send.disabled = true;
  try {
    const answer = await fetch(api(`chat/${encodeURIComponent(endpoint)}`), {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({messages})});
    const doc = await answer.json();
    if (!answer.ok) { messages.pop(); say("error", doc.error || `error ${answer.status}`); return; }
    messages.push({role: "assistant", content: doc.content});
    say("assistant", doc.content);
  } catch (e) {
    messages.pop();
    say("error", `the dashboard did not answer: ${e}`);
  } finally {
    send.disabled = false;
  }
});

// -- the stream -----------------------------------------------------------------------------------------------
function connect() {
  if (stream) stream.close();
  stream = new EventSource(api("stream", selected ? {run: selected} : {}));
  const last = {};          // each part as last drawn: a part that did not change is not drawn again (the page
  const changed = (part, value) => {          // costs the machine nothing while a run is quiet)
    const text = JSON.stringify(value);
    if (last[part] === text) return false;
    last[part] = text;
    return true;
  };
  stream.addEventListener("overview", (event) => {
    const doc = JSON.parse(event.data);
    document.getElementById("updated").textContent = `updated ${new Date(doc.now * 1000).toLocaleTimeString()}`;
    if (changed("hosts", [doc.hosts, doc.hosts_taken, doc.picture])) renderHosts(doc);
    if (changed("runs", [doc.runs, selected])) renderRuns(doc.runs);
    if (changed("endpoints", doc.endpoints)) renderEndpoints(doc.endpoints);
  });
  stream.addEventListener("run", (event) => { if (changed("run", event.data)) renderRun(JSON.parse(event.data)); });
  stream.onerror = () => { document.getElementById("updated").textContent = "connection lost: retrying…"; };
}

connect();
