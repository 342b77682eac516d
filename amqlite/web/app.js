// amqlite's management page: one ES module, no build step, no library.
// It only talks to the management API (docs/http.md). Logging in opens a session
// (POST /api/login): an HttpOnly, SameSite=Strict cookie the page never sees, and
// every request carries the X-Amqlite-Page header the server asks of a change made
// under that cookie (a page on another site cannot add it: no CSRF). Everything
// the broker says is put in the page as text (textContent), never as HTML.

const POLL_MS = 2000;
const POINTS = 90;
const COLORS = ["#2e8b57", "#3b6fb6", "#c98a14", "#b3261e", "#7b4fb6"];

const $ = (id) => document.getElementById(id);
const state = {
  tags: [],
  previous: null, // {at, stats}: the last overview's counters, for the rate chart
  series: { rates: [[], [], []], depths: [[], []], lag: new Map() },
  timer: null,
};

class LoginNeeded extends Error {}

async function api(method, path, body) {
  const headers = { "X-Amqlite-Page": "1" };
  const init = { method, headers, credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const reply = await fetch(path, init);
  if (reply.status === 401) throw new LoginNeeded();
  const text = await reply.text();
  const data = text ? JSON.parse(text) : null;
  if (!reply.ok) throw new Error(data && data.reason ? data.reason : `${reply.status}`);
  return data;
}

const enc = encodeURIComponent;

// --- logging in ------------------------------------------------------------------

function showLogin(message) {
  clearInterval(state.timer);
  state.timer = null;
  $("main").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("who").textContent = "";
  $("login-error").textContent = message || "";
}

async function start() {
  try {
    const me = await api("GET", "/api/whoami");
    state.tags = me.tags;
    $("who").textContent = `${me.name} (${me.tags.join(", ") || "no tags"})`;
  } catch (error) {
    showLogin(error instanceof LoginNeeded ? "" : String(error.message));
    return;
  }
  const can = (tag) => state.tags.includes(tag) || state.tags.includes("administrator");
  document.body.classList.toggle("can-change", can("administrator"));
  document.body.classList.toggle("can-monitor", can("monitoring"));
  $("login").hidden = true;
  $("main").hidden = false;
  $("logout").hidden = false;
  await refresh();
  state.timer = setInterval(refresh, POLL_MS);
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = new FormData(event.target);
  try {
    await api("POST", "/api/login", { username: form.get("user"), password: form.get("password") });
  } catch (error) {
    showLogin(error instanceof LoginNeeded ? "Wrong user or password." : error.message);
    return;
  }
  event.target.reset();
  start();
});

$("logout").addEventListener("click", async () => {
  try {
    await api("POST", "/api/logout");
  } finally {
    showLogin("");
  }
});

// --- polling -----------------------------------------------------------------------

async function refresh() {
  try {
    const monitoring = document.body.classList.contains("can-monitor");
    const [overview, queues, exchanges, connections, ha, links] = await Promise.all([
      api("GET", "/api/overview"),
      api("GET", "/api/queues"),
      api("GET", "/api/exchanges"),
      api("GET", "/api/connections"),
      monitoring ? api("GET", "/api/ha") : null,
      monitoring ? api("GET", "/api/links") : [],
    ]);
    $("notice").textContent = "";
    showOverview(overview);
    showQueues(queues);
    showExchanges(exchanges);
    showConnections(connections);
    showHa(ha, overview);
    showLinks(links);
    drawCharts();
  } catch (error) {
    if (error instanceof LoginNeeded) showLogin("Log in again.");
    else $("notice").textContent = `The broker did not answer: ${error.message}`;
  }
}

function push(series, value) {
  series.push(value);
  if (series.length > POINTS) series.shift();
}

function showOverview(o) {
  $("node-name").textContent = o.node;
  const badge = $("node-state");
  badge.textContent = o.state;
  badge.className = `badge ${o.state}`;
  const totals = o.queue_totals;
  $("total-ready").textContent = totals.messages_ready;
  $("total-unacked").textContent = totals.messages_unacknowledged;
  const t = o.object_totals;
  $("totals").textContent =
    `${t.queues} queues, ${t.exchanges} exchanges, ${t.connections} connections, ${t.consumers} consumers`;
  $("alarms").textContent = o.alarms.length ? o.alarms.join(", ") : "none";
  const now = performance.now() / 1000;
  const stats = o.message_stats;
  const previous = state.previous;
  if (previous) {
    const seconds = Math.max(now - previous.at, 0.001);
    ["publish", "deliver_get", "ack"].forEach((name, i) => {
      push(state.series.rates[i], Math.max(0, (stats[name] - previous.stats[name]) / seconds));
    });
  }
  state.previous = { at: now, stats };
  push(state.series.depths[0], totals.messages_ready);
  push(state.series.depths[1], totals.messages_unacknowledged);
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function button(td, label, action) {
  const b = document.createElement("button");
  b.textContent = label;
  b.className = "admin";
  b.addEventListener("click", async () => {
    try {
      await action();
      await refresh();
    } catch (error) {
      $("notice").textContent = error.message;
    }
  });
  td.append(b, " ");
}

function fill(tableId, items, addRow) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren();
  for (const item of items) addRow(body.insertRow(), item);
}

function showQueues(queues) {
  fill("queues", queues, (row, q) => {
    row.dataset.queue = q.name;
    cell(row, q.vhost);
    cell(row, q.name);
    cell(row, q.messages_ready, "num ready");
    cell(row, q.messages_unacknowledged, "num");
    cell(row, q.consumers, "num");
    cell(row, q.message_stats.publish_details.rate.toFixed(1), "num");
    cell(row, q.message_stats.deliver_get_details.rate.toFixed(1), "num");
    const actions = cell(row, "");
    const path = `/api/queues/${enc(q.vhost)}/${enc(q.name)}`;
    button(actions, "Get", async () => {
      const got = await api("POST", `${path}/get`, { count: 5, ackmode: "ack_requeue_true" });
      $("got").hidden = false;
      $("got-messages").textContent = JSON.stringify(got, null, 2);
    });
    button(actions, "Purge", () => api("DELETE", `${path}/contents`));
    button(actions, "Delete", () => {
      if (!confirm(`Delete queue ${q.name}?`)) return Promise.resolve();
      return api("DELETE", path);
    });
  });
}

function showExchanges(exchanges) {
  fill("exchanges", exchanges, (row, x) => {
    cell(row, x.vhost);
    cell(row, x.name || "(default)");
    cell(row, x.type);
    cell(row, x.durable ? "yes" : "no");
    const actions = cell(row, "");
    if (x.name && !x.name.startsWith("amq.")) {
      button(actions, "Delete", () => api("DELETE", `/api/exchanges/${enc(x.vhost)}/${enc(x.name)}`));
    }
  });
}

function showConnections(connections) {
  fill("connections", connections, (row, c) => {
    cell(row, c.name);
    cell(row, c.user);
    cell(row, c.vhost);
    cell(row, c.protocol);
    cell(row, c.channels, "num");
    cell(row, c.state);
    button(cell(row, ""), "Close", () => api("DELETE", `/api/connections/${enc(c.name)}`));
  });
}

// --- drawings ------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attributes, text) {
  const element = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  if (text !== undefined) element.textContent = text;
  return element;
}

const STATE_COLORS = { active: "#2e8b57", passive: "#3b6fb6", up: "#2e8b57" };

function nodeBox(x, title, lines, stateName) {
  const group = svg("g", {});
  group.append(
    svg("rect", { x, y: 10, width: 190, height: 90, rx: 8, fill: STATE_COLORS[stateName] || "#c98a14" }),
    svg("text", { x: x + 10, y: 32, fill: "#fff", "font-weight": "bold" }, title),
  );
  lines.forEach((line, i) => group.append(svg("text", { x: x + 10, y: 54 + i * 18, fill: "#fff" }, line)));
  return group;
}

function showHa(ha, overview) {
  const section = $("ha-section");
  if (!ha || !ha.state || ha.role === "standalone") {
    section.hidden = true;
    return;
  }
  section.hidden = false;
  const drawing = $("ha-drawing");
  drawing.replaceChildren(
    nodeBox(10, `${overview.node} (${ha.role})`, [`state: ${ha.state}`, `epoch: ${ha.epoch}`], ha.state),
    svg("line", {
      x1: 200, y1: 55, x2: 320, y2: 55,
      stroke: ha.link_up ? "#2e8b57" : "#b3261e", "stroke-width": 4,
      "stroke-dasharray": ha.peer_alive ? "" : "6 6",
    }),
    svg("text", { x: 215, y: 48 }, ha.peer_alive ? "heartbeats" : "peer silent"),
    nodeBox(
      320,
      `${ha.peer_id || ha.peer_address || "peer"}`,
      [`state: ${ha.peer_state || "unknown"}`, `epoch: ${ha.peer_epoch ?? "?"}`],
      ha.peer_alive ? ha.peer_state : "unknown",
    ),
  );
}

function showLinks(links) {
  const section = $("links-section");
  section.hidden = links.length === 0;
  $("lag-figure").hidden = links.length === 0;
  const drawing = $("links-drawing");
  drawing.setAttribute("height", String(Math.max(40, links.length * 34 + 8)));
  drawing.replaceChildren();
  links.forEach((link, i) => {
    const y = 8 + i * 34;
    const color = STATE_COLORS[link.state] || "#c98a14";
    drawing.append(
      svg("rect", { x: 4, y, width: 200, height: 26, rx: 6, fill: "#1d2330" }),
      svg("text", { x: 12, y: y + 18, fill: "#fff" }, `${link.vhost} ${link.exchange}`),
      svg("line", { x1: 204, y1: y + 13, x2: 480, y2: y + 13, stroke: color, "stroke-width": 4 }),
      svg("text", { x: 214, y: y + 9, "font-size": 11 }, `${link.mode} · ${link.state} · lag ${link.lag_messages}`),
      svg("rect", { x: 480, y, width: 230, height: 26, rx: 6, fill: color }),
      svg("text", { x: 488, y: y + 18, fill: "#fff" }, link.remote_node || link.remote_address || "remote"),
    );
  });
  fill("links", links, (row, l) => {
    cell(row, l.link);
    cell(row, `${l.vhost} ${l.exchange}`);
    cell(row, l.mode);
    cell(row, l.state);
    cell(row, l.remote_node || l.remote_address || "");
    cell(row, l.lag_messages, "num");
    cell(row, l.in_flight, "num");
    cell(row, l.duplicates_dropped, "num");
    cell(row, l.loops_dropped, "num");
  });
  const seen = new Set();
  for (const l of links) {
    const key = `${l.exchange} ${l.link}`;
    seen.add(key);
    if (!state.series.lag.has(key)) state.series.lag.set(key, []);
    push(state.series.lag.get(key), l.lag_messages);
  }
  for (const key of [...state.series.lag.keys()]) if (!seen.has(key)) state.series.lag.delete(key);
}

function drawChart(canvas, seriesList, labels) {
  const g = canvas.getContext("2d");
  const { width, height } = canvas;
  g.clearRect(0, 0, width, height);
  const top = Math.max(1, ...seriesList.flat());
  g.font = "11px system-ui";
  g.fillStyle = "#556";
  g.fillText(top.toFixed(top < 10 ? 1 : 0), 2, 11);
  g.strokeStyle = "#e4e6eb";
  g.beginPath();
  g.moveTo(0, height - 1);
  g.lineTo(width, height - 1);
  g.stroke();
  seriesList.forEach((series, i) => {
    g.strokeStyle = COLORS[i % COLORS.length];
    g.lineWidth = 2;
    g.beginPath();
    const step = width / (POINTS - 1);
    const start = width - (series.length - 1) * step; // the newest point at the right edge
    series.forEach((value, j) => {
      const x = start + j * step;
      const y = height - 2 - (value / top) * (height - 16);
      if (j === 0) g.moveTo(x, y);
      else g.lineTo(x, y);
    });
    g.stroke();
    g.fillStyle = COLORS[i % COLORS.length];
    g.fillText(labels[i], 60 + i * 90, 11);
  });
}

function drawCharts() {
  drawChart($("chart-rates"), state.series.rates, ["publish", "deliver", "ack"]);
  drawChart($("chart-depths"), state.series.depths, ["ready", "unacked"]);
  drawChart($("chart-lag"), [...state.series.lag.values()], [...state.series.lag.keys()]);
}

// --- forms ---------------------------------------------------------------------------

function onSubmit(formId, action) {
  $(formId).addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = new FormData(event.target);
    try {
      await action(form);
      await refresh();
    } catch (error) {
      $("notice").textContent = error instanceof LoginNeeded ? "Log in again." : error.message;
    }
  });
}

onSubmit("queue-form", (f) =>
  api("PUT", `/api/queues/${enc(f.get("vhost"))}/${enc(f.get("name"))}`, {
    durable: f.get("durable") === "on",
  }),
);
onSubmit("exchange-form", (f) =>
  api("PUT", `/api/exchanges/${enc(f.get("vhost"))}/${enc(f.get("name"))}`, { type: f.get("type") }),
);
onSubmit("bind-form", (f) =>
  api("POST", `/api/bindings/${enc(f.get("vhost"))}/e/${enc(f.get("source"))}/q/${enc(f.get("destination"))}`, {
    routing_key: f.get("routing_key"),
  }),
);
onSubmit("publish-form", async (f) => {
  const exchange = f.get("exchange") || "amq.default";
  const reply = await api("POST", `/api/exchanges/${enc(f.get("vhost"))}/${enc(exchange)}/publish`, {
    routing_key: f.get("routing_key"),
    payload: f.get("payload"),
    payload_encoding: "string",
    properties: f.get("persistent") === "on" ? { delivery_mode: 2 } : {},
  });
  $("publish-result").textContent = reply.routed ? "routed" : "not routed";
});

start(); // a session cookie from before is still good until it idles out
