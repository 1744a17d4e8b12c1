// The Rosetta console: a page over the admin API and nothing else. Every
// action is one of the API's requests (docs/admin.md); what the API cannot
// do, the console cannot either. No build step, no libraries.
"use strict";

const REFRESH_MS = 5000;
// The overview refreshes faster: its chart is of rates.
const OVERVIEW_REFRESH_MS = 2000;
// Readings the rates chart keeps (two minutes at OVERVIEW_REFRESH_MS).
const RATE_SAMPLES_MAX = 60;
const CHART = { width: 640, height: 200, left: 48, bottom: 20, top: 10 };
const SERIES_COLOURS = ["#2a6", "#36c", "#c63", "#939", "#c33", "#399"];
const SVG_NS = "http://www.w3.org/2000/svg";
const PAGE_SIZE = 100;
const PEEK_COUNT = 10;

const state = { auth: sessionStorage.getItem("rosetta.auth"), view: "overview", timer: null };
// The rates chart: per series name, the last readings [{t, v}]; `previous`
// is the last overview's counters, for rates computed here.
const rates = { series: new Map(), previous: null, source: null };

const $ = (id) => document.getElementById(id);

function say(text, ok) {
  $("status").textContent = text;
  $("status").className = ok ? "ok" : "";
}

// One API request; an error answer throws its reason.
async function api(method, path, body, headers) {
  const h = Object.assign({ "X-Requested-With": "XMLHttpRequest" }, headers || {});
  if (state.auth) h["Authorization"] = state.auth;
  if (body !== undefined) h["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers: h,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  const value = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = new Error(`${response.status}: ${value && value.reason ? value.reason : response.statusText}`);
    error.status = response.status;
    throw error;
  }
  return value;
}

const enc = encodeURIComponent;

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function button(td, label, action) {
  const b = document.createElement("button");
  b.textContent = label;
  b.dataset.action = label.toLowerCase();
  b.addEventListener("click", async () => {
    try {
      await action();
      await refresh();
    } catch (e) {
      say(e.message);
    }
  });
  td.appendChild(b);
  return b;
}

// The numbers of `obj`, nested keys joined with ".": {"a": {"b": 1}} is
// {"a.b": 1}.
function numbersOf(obj, prefix, out) {
  for (const [k, v] of Object.entries(obj || {})) {
    const name = prefix ? `${prefix}.${k}` : k;
    if (typeof v === "number") out[name] = v;
    else if (v && typeof v === "object" && !Array.isArray(v)) numbersOf(v, name, out);
  }
  return out;
}

// The rates of one overview reading: the broker's own (`messages.rates`,
// per second over its recent window) when it reports them; otherwise
// computed here from the change of its counters since the previous
// reading (the journal's records, and message totals if it has them).
function ratesOf(o, now) {
  const server = o.messages && o.messages.rates;
  if (server && typeof server === "object") {
    rates.source = "server";
    const out = numbersOf(server, "", {});
    delete out.window_s;
    return out;
  }
  rates.source = "client";
  const counters = numbersOf(o.messages, "messages", {});
  if (o.journal) counters["journal records"] = o.journal.commits_total;
  const previous = rates.previous;
  rates.previous = { t: now, counters };
  if (!previous || now <= previous.t) return null;
  const seconds = (now - previous.t) / 1000;
  const out = {};
  for (const [k, v] of Object.entries(counters)) {
    const before = previous.counters[k];
    // A counter that went down (a restart) has no rate for this reading.
    if (typeof v === "number" && typeof before === "number" && v >= before) out[k] = (v - before) / seconds;
  }
  return out;
}

function svg(tag, attributes, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attributes)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function recordRates(reading, now) {
  if (!reading) return;
  for (const [name, v] of Object.entries(reading)) {
    if (!rates.series.has(name)) rates.series.set(name, []);
  }
  for (const [name, samples] of rates.series) {
    samples.push({ t: now, v: reading[name] || 0 });
    if (samples.length > RATE_SAMPLES_MAX) samples.shift();
  }
}

// Hand-drawn: one polyline per series over the last RATE_SAMPLES_MAX
// readings, scaled to the highest rate shown (no chart library, no CDN).
function drawRates() {
  const chart = $("rates-chart");
  const legend = $("rates-legend");
  chart.replaceChildren();
  legend.replaceChildren();
  const all = [...rates.series.values()].flat();
  // A fifth of headroom above the highest rate, so its line is not on the frame.
  const max = Math.max(1, ...all.map((s) => s.v)) * 1.2;
  const first = Math.min(...all.map((s) => s.t));
  const last = Math.max(...all.map((s) => s.t));
  const span = Math.max(1, last - first);
  const plotW = CHART.width - CHART.left;
  const plotH = CHART.height - CHART.bottom - CHART.top;
  const x = (t) => CHART.left + ((t - first) / span) * plotW;
  const y = (v) => CHART.top + plotH - (v / max) * plotH;
  chart.append(
    svg("line", { x1: CHART.left, y1: CHART.top, x2: CHART.left, y2: CHART.top + plotH, stroke: "#999" }),
    svg("line", { x1: CHART.left, y1: CHART.top + plotH, x2: CHART.width, y2: CHART.top + plotH, stroke: "#999" }),
    svg("text", { x: CHART.left - 4, y: CHART.top + 10, "text-anchor": "end", "font-size": 11 }, max.toFixed(max < 10 ? 1 : 0)),
    svg("text", { x: CHART.left - 4, y: CHART.top + plotH, "text-anchor": "end", "font-size": 11 }, "0"),
    svg("text", { x: CHART.width, y: CHART.height - 4, "text-anchor": "end", "font-size": 11 }, `last ${Math.round(span / 1000)} s`),
  );
  let i = 0;
  const latest = {};
  for (const [name, samples] of rates.series) {
    const colour = SERIES_COLOURS[i++ % SERIES_COLOURS.length];
    const points = samples.map((s) => `${x(s.t).toFixed(1)},${y(s.v).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", { points, fill: "none", stroke: colour, "stroke-width": 2, "data-series": name }));
    const now = samples.length ? samples[samples.length - 1].v : 0;
    latest[name] = now;
    const item = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.textContent = "\u25A0 ";
    swatch.dataset.colour = colour;
    item.append(swatch, `${name}: ${now.toFixed(1)}/s`);
    legend.append(item);
  }
  // Swatch colours through the CSSOM (the page's CSP allows no inline style).
  for (const s of legend.querySelectorAll(".swatch")) s.style.color = s.dataset.colour;
  chart.dataset.max = String(all.length ? Math.max(...all.map((s) => s.v)) : 0);
  chart.dataset.samples = String(all.length);
  chart.dataset.source = rates.source || "";
  chart.dataset.latest = JSON.stringify(latest);
  $("rates-caption").textContent = rates.source === "server"
    ? "Message rates (per second, as the broker reports them)"
    : "Rates (per second, from the change of the overview's counters)";
}

// Where the broker's demo client is: `/` of its HTTP port (`websocket`,
// `wss` under https, or the `any` port), on the host this page came from;
// `/` here when this page is served by that port itself
// (`[admin] on_http_port`). null without an HTTP port.
function demoUrl(listeners) {
  const secure = location.protocol === "https:";
  const addr = listeners && (listeners[secure ? "wss" : "websocket"] || listeners.any);
  if (!addr) return null;
  const port = addr.slice(addr.lastIndexOf(":") + 1);
  if (port === (location.port || (secure ? "443" : "80"))) return "/";
  return `${location.protocol}//${location.hostname}:${port}/`;
}

function showDemoLink(o) {
  const url = demoUrl(o.listeners);
  $("demo").hidden = !url;
  if (url) $("demo").href = url;
}

async function showOverview() {
  const o = await api("GET", "/api/v1/overview");
  showDemoLink(o);
  const now = Date.now();
  recordRates(ratesOf(o, now), now);
  drawRates();
  const rows = [
    ["Version", o.version],
    ["Node", o.node],
    ["Uptime (s)", o.uptime_s],
    ["Connections", o.connections.open],
    ["By protocol", JSON.stringify(o.connections.by_protocol)],
    ["By transport", JSON.stringify(o.connections.by_transport)],
    ["Listeners", Object.entries(o.listeners || {}).map(([k, v]) => `${k} ${v}`).join(", ")],
    ["Queues", o.queues.count],
    ["Memory used / budget (bytes)", `${o.memory.used_bytes} / ${o.memory.budget_bytes}`],
    ["Paged messages", o.memory.paged_messages],
    ["Journal (bytes)", o.journal.bytes],
  ];
  const dl = $("overview");
  dl.replaceChildren();
  for (const [k, v] of rows) {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = String(v);
    dd.dataset.key = k;
    dl.append(dt, dd);
  }
}

// A rate as a table shows it: "-" until the broker has a window for it
// (the first look at a queue or connection).
function rate(rates, key) {
  if (!rates || !rates.window_s) return "-";
  return rates[key].toFixed(1);
}

async function createQueue(event) {
  event.preventDefault();
  const name = $("queue-name").value.trim();
  try {
    await api("PUT", `/api/v1/queues/${enc(name)}`, { durable: $("queue-durable").checked });
    $("queue-create").reset();
    say(`queue ${name} created`, true);
    await refresh();
  } catch (e) {
    say(e.message);
  }
}

// "N things", and how many of them a listing's first page shows.
function showTotal(id, listing, noun) {
  const shown = listing.total > listing.items.length ? `, first ${listing.items.length} shown` : "";
  $(id).textContent = `${listing.total} ${noun}${shown}`;
}

async function peek(name) {
  const p = await api("GET", `/api/v1/queues/${enc(name)}/messages?count=${PEEK_COUNT}`);
  $("peek-title").hidden = false;
  $("peek-title").textContent = `First messages of ${name} (${p.paged} more on disk)`;
  $("peek").textContent = p.messages
    .map((m) => `#${m.id} ${m.size} bytes ${JSON.stringify(m.properties)}\n${m.payload}`)
    .join("\n\n") || "(none in memory)";
}

async function showQueues() {
  const filter = $("queue-filter").value;
  const q = await api("GET", `/api/v1/queues?page_size=${PAGE_SIZE}&name=${enc(filter)}`);
  const body = $("queues");
  body.replaceChildren();
  for (const item of q.items) {
    const row = document.createElement("tr");
    row.dataset.queue = item.name;
    cell(row, item.name);
    cell(row, item.depth, "number").dataset.field = "depth";
    cell(row, item.in_flight, "number");
    cell(row, item.consumers, "number");
    cell(row, item.oldest_message_age_ms, "number");
    cell(row, rate(item.rates, "published_per_s"), "number").dataset.field = "in_rate";
    cell(row, rate(item.rates, "delivered_per_s"), "number").dataset.field = "out_rate";
    const actions = cell(row, "");
    button(actions, "Peek", () => peek(item.name));
    button(actions, "Purge", async () => {
      const r = await api("POST", `/api/v1/queues/${enc(item.name)}/purge`);
      say(`${item.name}: ${r.removed} messages removed`, true);
    });
    button(actions, "Move", async () => {
      const to = $("move-to").value.trim();
      if (!to) throw new Error("name the queue to move to first");
      const body = { to };
      const count = Number($("move-count").value);
      if (count) body.count = count;
      const r = await api("POST", `/api/v1/queues/${enc(item.name)}/move`, body);
      say(`${item.name}: ${r.moved} moved to ${to}, ${r.left} left`, true);
    });
    // Meant for a dead-letter queue; on another queue it moves nothing.
    button(actions, "Replay", async () => {
      const r = await api("POST", `/api/v1/queues/${enc(item.name)}/replay`);
      say(`${item.name}: ${r.moved} sent back to their queues, ${r.left} left`, true);
    });
    button(actions, "Delete", async () => {
      await api("DELETE", `/api/v1/queues/${enc(item.name)}`);
      say(`${item.name} deleted`, true);
    });
    body.appendChild(row);
  }
  showTotal("queue-total", q, "queue(s)");
}

// Stream logs, one row per log and consumer group (a log without a group
// has one row): GET /api/v1/streams.
async function showStreams() {
  const filter = $("stream-filter").value;
  const s = await api("GET", `/api/v1/streams?page_size=${PAGE_SIZE}&name=${enc(filter)}`);
  const body = $("streams");
  body.replaceChildren();
  for (const item of s.items) {
    for (const group of item.groups.length ? item.groups : [null]) {
      const row = document.createElement("tr");
      row.dataset.stream = item.name;
      if (group) row.dataset.group = group.name;
      cell(row, item.name);
      cell(row, item.messages, "number").dataset.field = "messages";
      cell(row, item.bytes, "number");
      cell(row, item.readers, "number");
      cell(row, group && group.name);
      cell(row, group && group.committed_offset, "number").dataset.field = "committed";
      cell(row, group && group.lag, "number").dataset.field = "lag";
      body.appendChild(row);
    }
  }
  showTotal("stream-total", s, "stream log(s)");
}

async function showConnections() {
  const c = await api("GET", `/api/v1/connections?page_size=${PAGE_SIZE}`);
  const body = $("connections");
  body.replaceChildren();
  for (const item of c.items) {
    const row = document.createElement("tr");
    row.dataset.connection = String(item.id);
    row.dataset.clientId = item.client_id || "";
    for (const v of [item.id, item.protocol, item.transport, item.peer, item.user, item.client_id]) cell(row, v);
    cell(row, item.messages_in, "number").dataset.field = "messages_in";
    cell(row, item.messages_out, "number").dataset.field = "messages_out";
    cell(row, rate(item.rates, "messages_in_per_s"), "number");
    cell(row, rate(item.rates, "messages_out_per_s"), "number");
    button(cell(row, ""), "Close", async () => {
      await api("DELETE", `/api/v1/connections/${item.id}`, undefined, { "X-Reason": $("close-reason").value });
      say(`connection ${item.id} closed`, true);
    });
    body.appendChild(row);
  }
}

async function showSessions() {
  const filter = $("session-filter").value;
  const s = await api("GET", `/api/v1/sessions?page_size=${PAGE_SIZE}&name=${enc(filter)}`);
  const body = $("sessions");
  body.replaceChildren();
  for (const item of s.items) {
    const row = document.createElement("tr");
    row.dataset.session = item.client_id;
    cell(row, item.client_id);
    cell(row, item.persistent ? "yes" : "no");
    cell(row, item.connected ? "yes" : "no").dataset.field = "connected";
    cell(row, item.depth, "number").dataset.field = "depth";
    cell(row, item.in_flight, "number");
    cell(row, Array.isArray(item.subscriptions) ? item.subscriptions.length : item.subscriptions, "number");
    // The API refuses (409) to delete the session of a connected client.
    button(cell(row, ""), "Delete", async () => {
      await api("DELETE", `/api/v1/sessions/${enc(item.client_id)}`);
      say(`session ${item.client_id} deleted`, true);
    });
    body.appendChild(row);
  }
  showTotal("session-total", s, "session(s)");
}

// The roles, built-in and defined: GET /api/v1/roles. Also what the
// user form offers, so that it lists every role the broker knows.
async function showRoles() {
  const r = await api("GET", `/api/v1/roles?page_size=${PAGE_SIZE}`);
  const body = $("roles");
  body.replaceChildren();
  for (const item of r.items) {
    const row = document.createElement("tr");
    row.dataset.role = item.name;
    row.dataset.builtin = String(item.builtin);
    cell(row, item.name);
    cell(row, item.admin).dataset.field = "admin";
    // A built-in role's allow lists are null: it says nothing of them.
    cell(row, shown(item.publish)).dataset.field = "publish";
    cell(row, shown(item.subscribe)).dataset.field = "subscribe";
    cell(row, shown(item.deny_publish)).dataset.field = "deny_publish";
    cell(row, shown(item.deny_subscribe)).dataset.field = "deny_subscribe";
    cell(row, (item.users || []).join(", ") || "-").dataset.field = "users";
    const allows = cell(row, "");
    const details = document.createElement("details");
    const summary = document.createElement("summary");
    summary.textContent = `${(item.allows || []).length} routes`;
    const list = document.createElement("ul");
    for (const route of item.allows || []) {
      const li = document.createElement("li");
      li.textContent = route;
      list.append(li);
    }
    details.append(summary, list);
    allows.replaceChildren(details);
    const actions = cell(row, "");
    if (!item.builtin) {
      button(actions, "Edit", async () => editRole(item));
      // The API refuses (409) to remove a role that users still hold.
      button(actions, "Delete", async () => {
        await api("DELETE", `/api/v1/roles/${enc(item.name)}`);
        say(`role ${item.name} removed`, true);
      });
    }
    body.appendChild(row);
  }
  return r.items;
}

// Fills the role form with `item`'s definition, to change and save.
function editRole(item) {
  $("role-name").value = item.name;
  $("role-admin").value = item.admin || "";
  $("role-publish").value = patterns(item.publish) || "";
  $("role-subscribe").value = patterns(item.subscribe) || "";
  $("role-deny-publish").value = patterns(item.deny_publish) || "";
  $("role-deny-subscribe").value = patterns(item.deny_subscribe) || "";
  $("role-name").focus();
}

async function defineRole(event) {
  event.preventDefault();
  const name = $("role-name").value;
  // PUT carries the whole definition: an absent allow list says nothing.
  const body = {
    deny_publish: patternList($("role-deny-publish").value) || [],
    deny_subscribe: patternList($("role-deny-subscribe").value) || [],
  };
  const publish = patternList($("role-publish").value);
  const subscribe = patternList($("role-subscribe").value);
  if (publish) body.publish = publish;
  if (subscribe) body.subscribe = subscribe;
  if ($("role-admin").value) body.admin = $("role-admin").value;
  try {
    await api("PUT", `/api/v1/roles/${enc(name)}`, body);
    $("role-define").reset();
    say(`role ${name} saved`, true);
    await refresh();
  } catch (e) {
    say(e.message);
  }
}

const patterns = (list) => (Array.isArray(list) ? list.join(", ") : list);
// A list as a table shows it: "-" for an absent or empty one.
const shown = (list) => patterns(list) || "-";

// The user form's role choices: every role the broker knows, keeping what
// is ticked across refreshes.
async function offerRoles() {
  const r = await api("GET", `/api/v1/roles?page_size=${PAGE_SIZE}`);
  for (const box of [$("user-roles"), $("change-roles")]) {
    const ticked = new Set(tickedRoles(box));
    for (const old of box.querySelectorAll("label")) old.remove();
    for (const item of r.items) {
      const label = document.createElement("label");
      const input = document.createElement("input");
      input.type = "checkbox";
      input.name = "role";
      input.value = item.name;
      input.checked = ticked.has(item.name);
      label.append(input, ` ${item.name}`);
      box.append(label);
    }
  }
}

const tickedRoles = (box) => [...box.querySelectorAll("input[name=role]:checked")].map((c) => c.value);

// Fills the change form with `item`: its roles ticked, its own lists.
function editUser(item) {
  const form = $("user-change");
  form.hidden = false;
  form.dataset.user = item.name;
  $("change-name").textContent = item.name;
  $("change-password").value = "";
  const roles = new Set(item.roles);
  for (const c of $("change-roles").querySelectorAll("input[name=role]")) c.checked = roles.has(c.value);
  const own = item.own || {};
  $("change-publish").value = patterns(own.publish) || "";
  $("change-subscribe").value = patterns(own.subscribe) || "";
  $("change-deny-publish").value = patterns(own.deny_publish) || "";
  $("change-deny-subscribe").value = patterns(own.deny_subscribe) || "";
}

// One change of the user the change form shows: PUT of `what`.
async function changeUser(what, body, done) {
  const name = $("user-change").dataset.user;
  try {
    await api("PUT", `/api/v1/users/${enc(name)}/${what}`, body);
    say(`${name}: ${done}`, true);
    await refresh();
  } catch (e) {
    say(e.message);
  }
}

function ownPermissions() {
  const body = {
    deny_publish: patternList($("change-deny-publish").value) || [],
    deny_subscribe: patternList($("change-deny-subscribe").value) || [],
  };
  const publish = patternList($("change-publish").value);
  const subscribe = patternList($("change-subscribe").value);
  if (publish) body.publish = publish;
  if (subscribe) body.subscribe = subscribe;
  return body;
}

async function showUsers() {
  const [u] = await Promise.all([api("GET", `/api/v1/users?page_size=${PAGE_SIZE}`), offerRoles()]);
  const body = $("users");
  body.replaceChildren();
  for (const item of u.items) {
    const row = document.createElement("tr");
    row.dataset.user = item.name;
    cell(row, item.name);
    cell(row, item.roles.join(", ") || "-").dataset.field = "roles";
    cell(row, item.admin).dataset.field = "admin";
    // Effective lists: the user's own and its roles' together.
    cell(row, shown(item.publish)).dataset.field = "publish";
    cell(row, shown(item.subscribe)).dataset.field = "subscribe";
    cell(row, shown(item.deny_publish)).dataset.field = "deny_publish";
    cell(row, shown(item.deny_subscribe)).dataset.field = "deny_subscribe";
    const actions = cell(row, "");
    button(actions, "Edit", async () => editUser(item));
    button(actions, "Delete", async () => {
      await api("DELETE", `/api/v1/users/${enc(item.name)}`);
      say(`user ${item.name} deleted`, true);
    });
    body.appendChild(row);
  }
}

const views = {
  overview: showOverview,
  queues: showQueues,
  streams: showStreams,
  connections: showConnections,
  sessions: showSessions,
  users: showUsers,
  roles: showRoles,
};

function startTimer() {
  clearInterval(state.timer);
  state.timer = setInterval(refresh, state.view === "overview" ? OVERVIEW_REFRESH_MS : REFRESH_MS);
}

async function refresh() {
  // The view this refresh drew: one for another view may still be in flight.
  const view = state.view;
  try {
    await views[view]();
    document.body.dataset.refreshed = `${view}:${Date.now()}`;
  } catch (e) {
    if (e.status === 401) return logout("logged out: " + e.message);
    say(e.message);
  }
}

function show(view) {
  state.view = view;
  for (const s of document.querySelectorAll(".view")) s.hidden = s.id !== `view-${view}`;
  for (const b of document.querySelectorAll("#nav [data-view]")) b.classList.toggle("active", b.dataset.view === view);
  say("");
  startTimer();
  refresh();
}

function loggedIn(who) {
  $("login").hidden = true;
  $("nav").hidden = false;
  $("who").textContent = who;
  api("GET", "/api/v1/overview").then(showDemoLink, () => {});
  show(state.view);
}

function logout(text) {
  state.auth = null;
  sessionStorage.removeItem("rosetta.auth");
  clearInterval(state.timer);
  $("nav").hidden = true;
  for (const s of document.querySelectorAll(".view")) s.hidden = true;
  $("login").hidden = false;
  $("who").textContent = "";
  say(text || "");
}

async function login(event) {
  event.preventDefault();
  const user = $("login-user").value;
  const token = $("login-token").value.trim();
  // Basic credentials are UTF-8, base64-encoded.
  const basic = () => "Basic " + btoa(String.fromCharCode(...new TextEncoder().encode(`${user}:${$("login-password").value}`)));
  state.auth = token ? `Bearer ${token}` : basic();
  try {
    await api("GET", "/api/v1/overview");
    sessionStorage.setItem("rosetta.auth", state.auth);
    $("login-password").value = "";
    $("login-token").value = "";
    loggedIn(token ? "token" : user);
  } catch (e) {
    logout(e.message);
  }
}

// "a, b" as ["a", "b"]; empty: absent (the API's default: says nothing).
function patternList(text) {
  const list = text.split(",").map((p) => p.trim()).filter((p) => p);
  return list.length ? list : undefined;
}

async function addUser(event) {
  event.preventDefault();
  const name = $("user-name").value;
  const roles = [...document.querySelectorAll("#user-roles input[name=role]:checked")].map((c) => c.value);
  const body = { name, password: $("user-password").value, roles };
  const publish = patternList($("user-publish").value);
  const subscribe = patternList($("user-subscribe").value);
  if (publish) body.publish = publish;
  if (subscribe) body.subscribe = subscribe;
  body.deny_publish = patternList($("user-deny-publish").value) || [];
  body.deny_subscribe = patternList($("user-deny-subscribe").value) || [];
  try {
    await api("POST", "/api/v1/users", body);
    $("user-add").reset();
    say(`user ${name} added`, true);
    await refresh();
  } catch (e) {
    say(e.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", login);
  $("user-add").addEventListener("submit", addUser);
  $("role-define").addEventListener("submit", defineRole);
  $("queue-create").addEventListener("submit", createQueue);
  $("change-password-submit").addEventListener("click", () => {
    const password = $("change-password").value;
    if (!password) return say("type the new password first");
    changeUser("password", { password }, "password changed");
    $("change-password").value = "";
  });
  $("change-roles-submit").addEventListener("click", () =>
    changeUser("roles", { roles: tickedRoles($("change-roles")) }, "roles set"));
  $("change-permissions-submit").addEventListener("click", () =>
    changeUser("permissions", ownPermissions(), "permissions set"));
  $("change-done").addEventListener("click", () => { $("user-change").hidden = true; });
  $("logout").addEventListener("click", () => logout("logged out"));
  $("queue-filter").addEventListener("input", () => refresh());
  $("session-filter").addEventListener("input", () => refresh());
  $("stream-filter").addEventListener("input", () => refresh());
  for (const b of document.querySelectorAll("#nav [data-view]")) b.addEventListener("click", () => show(b.dataset.view));
  if (state.auth) {
    api("GET", "/api/v1/overview").then(() => loggedIn("(remembered)"), () => logout(""));
  } else {
    logout("");
  }
  document.title = "Rosetta console";
  document.body.dataset.ready = "1";
});
