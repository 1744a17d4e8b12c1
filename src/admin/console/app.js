// The Rosetta console: a page over the admin API and nothing else. Every
// action is one of the API's requests (docs/admin.md); what the API cannot
// do, the console cannot either. No build step, no libraries.
"use strict";

const REFRESH_MS = 5000;
const PAGE_SIZE = 100;
const PEEK_COUNT = 10;

const state = { auth: sessionStorage.getItem("rosetta.auth"), view: "overview", timer: null };

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

async function showOverview() {
  const o = await api("GET", "/api/v1/overview");
  const rows = [
    ["Version", o.version],
    ["Node", o.node],
    ["Uptime (s)", o.uptime_s],
    ["Connections", o.connections.open],
    ["By protocol", JSON.stringify(o.connections.by_protocol)],
    ["By transport", JSON.stringify(o.connections.by_transport)],
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
    const actions = cell(row, "");
    button(actions, "Peek", () => peek(item.name));
    button(actions, "Purge", async () => {
      const r = await api("POST", `/api/v1/queues/${enc(item.name)}/purge`);
      say(`${item.name}: ${r.removed} messages removed`, true);
    });
    button(actions, "Delete", async () => {
      await api("DELETE", `/api/v1/queues/${enc(item.name)}`);
      say(`${item.name} deleted`, true);
    });
    body.appendChild(row);
  }
  $("queue-total").textContent = `${q.total} queue(s)` + (q.total > q.items.length ? `, first ${q.items.length} shown` : "");
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
    button(cell(row, ""), "Close", async () => {
      await api("DELETE", `/api/v1/connections/${item.id}`, undefined, { "X-Reason": $("close-reason").value });
      say(`connection ${item.id} closed`, true);
    });
    body.appendChild(row);
  }
}

async function showUsers() {
  const u = await api("GET", `/api/v1/users?page_size=${PAGE_SIZE}`);
  const body = $("users");
  body.replaceChildren();
  for (const item of u.items) {
    const row = document.createElement("tr");
    row.dataset.user = item.name;
    cell(row, item.name);
    cell(row, item.roles.join(", "));
    button(cell(row, ""), "Delete", async () => {
      await api("DELETE", `/api/v1/users/${enc(item.name)}`);
      say(`user ${item.name} deleted`, true);
    });
    body.appendChild(row);
  }
}

const views = { overview: showOverview, queues: showQueues, connections: showConnections, users: showUsers };

async function refresh() {
  try {
    await views[state.view]();
    document.body.dataset.refreshed = String(Date.now());
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
  refresh();
}

function loggedIn(who) {
  $("login").hidden = true;
  $("nav").hidden = false;
  $("who").textContent = who;
  clearInterval(state.timer);
  state.timer = setInterval(refresh, REFRESH_MS);
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

async function addUser(event) {
  event.preventDefault();
  const role = $("user-role").value;
  const name = $("user-name").value;
  try {
    await api("POST", "/api/v1/users", { name, password: $("user-password").value, roles: role ? [role] : [] });
    $("user-password").value = "";
    say(`user ${name} added`, true);
    await refresh();
  } catch (e) {
    say(e.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", login);
  $("user-add").addEventListener("submit", addUser);
  $("logout").addEventListener("click", () => logout("logged out"));
  $("queue-filter").addEventListener("input", () => refresh());
  for (const b of document.querySelectorAll("#nav [data-view]")) b.addEventListener("click", () => show(b.dataset.view));
  if (state.auth) {
    api("GET", "/api/v1/overview").then(() => loggedIn("(remembered)"), () => logout(""));
  } else {
    logout("");
  }
  document.title = "Rosetta console";
  document.body.dataset.ready = "1";
});
