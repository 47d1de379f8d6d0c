// plurk web client: plain JavaScript over plurkcore's JSON API and the /Poll/ endpoints.
"use strict";

const RETRY_MS = 2000, MAX_BACKOFF_MS = 30000, READ_AFTER_MS = 3000;
const MAX_CHARS = 360, NEAR_LIMIT = 20;
const $ = (id) => document.getElementById(id);

// The server strips the content and counts characters (code points, Python's len), not UTF-16 units.
const chars = (text) => [...text.trim()].length;
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function checkLength(input) {
  const over = chars(input.value) - MAX_CHARS;
  input.setCustomValidity(over > 0 ? `${plural(over, "character")} over the limit of ${MAX_CHARS}` : "");
  return MAX_CHARS - chars(input.value);
}

function csrfToken() {
  const m = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return m ? decodeURIComponent(m[1]) : "";
}

async function api(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: { "X-CSRFToken": csrfToken() } };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const resp = await fetch(path, opts);
  // a write of ours (markRead, follow) may bring an answer back to bytes the client gave already
  // (the count to the number it held, with other items): a held poll or a stream would not bring
  // them again, so the client asks again now for the current answers
  if (method !== "GET") pollNow();
  let data = null;
  if (resp.status !== 204) {
    try { data = await resp.json(); } catch (e) { data = null; }
  }
  if (!resp.ok) {
    const err = new Error((data && data.error) || `HTTP ${resp.status}`);
    err.status = resp.status;
    throw err;
  }
  return data;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function when(iso) {
  const d = new Date(iso);
  return isNaN(d) ? "" : d.toLocaleString();
}

// The timeline stays newest first whatever order plurks arrive in (page loads, polls, own posts).
function insertPlurk(node) {
  const list = $("timeline"), id = Number(node.dataset.id);
  list.insertBefore(node, [...list.children].find((li) => Number(li.dataset.id) < id) || null);
}

function plurkNode(p, isNew) {
  const li = el("li", { class: "plurk" + (isNew ? " new" : ""), "data-id": p.id, id: `plurk-${p.id}` },
    el("p", { class: "meta" }, el("a", { href: `/u/${encodeURIComponent(p.author)}` }, p.author), " · ",
       el("time", { datetime: p.created }, when(p.created))),
    el("p", { class: "content" }, p.content));
  const toggle = el("button", { type: "button", class: "link", "aria-expanded": "false" },
                    `Responses (${p.response_count || 0})`);
  const box = el("div", { class: "responses", hidden: "" });
  toggle.addEventListener("click", () => toggleResponses(p.id, toggle, box));
  li.append(toggle, box);
  return li;
}

async function toggleResponses(id, toggle, box) {
  const open = toggle.getAttribute("aria-expanded") === "true";
  toggle.setAttribute("aria-expanded", String(!open));
  box.hidden = open;
  if (open) return;
  box.textContent = "Loading…";
  try {
    const data = await api("GET", `/api/plurks/${id}`);
    box.textContent = "";
    const list = el("ul", {});
    for (const r of data.responses) {
      list.append(responseNode(r));
      // a response that arrived live is shown under the plurk already: the full list replaces it
      const arrived = box.parentElement && box.parentElement.querySelector(`:scope > .response[data-id="${r.id}"]`);
      if (arrived) arrived.remove();
    }
    const input = el("input", { "aria-label": "Your response", required: "" });
    input.addEventListener("input", () => checkLength(input));
    const form = el("form", { class: "respond" }, input, el("button", { type: "submit" }, "Respond"));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        const r = await api("POST", `/api/plurks/${id}/responses`, { content: input.value });
        list.append(responseNode(r));
        input.value = "";
      } catch (e) { input.setCustomValidity(e.message); input.reportValidity(); input.setCustomValidity(""); }
    });
    box.append(list, form);
  } catch (e) { box.textContent = `Could not load responses: ${e.message}`; }
}

function responseNode(r) {
  return el("li", { class: "response", "data-id": r.id }, el("strong", {}, r.author), " ", r.content);
}

// ---- live updates --------------------------------------------------------------------------
//
// fastpoll's client (fastpoll/static/fastpoll/fastpoll.js, loaded before this file) brings the
// answers: fastpoll.subscribe picks the transport (docs/web.md: a stream on the edge, a stream
// through nginx, long-polls, short polls, and the fall backs between them) and gives each new
// answer once.  Every page follows the unread count (the badge); the timeline also follows
// getMessages (one stream carries both), renders its items (showMessages; fetching the plurk of a
// response that is not on the page), and once they have been visible for READ_AFTER_MS marks
// read up to the newest rendered id.  getMessages returns the newest 50: when more are unread the
// older ones cannot be shown, so nothing is marked read until the person asks for it ("Mark all
// as read").  A write of the page's own (markRead, follow, a post) asks the client again for the
// current answers (pollNow).  <body data-*> counts what goes over the wire (onWire), for the
// tests and for a look in the inspector.

const live = { sub: null, stream: null, shownUpto: 0, readUpto: 0, readDue: 0, complete: true,
               markAll: false, readTimer: null, reading: false, rendering: Promise.resolve(),
               renderDelay: RETRY_MS };

const jitter = (ms) => Math.round(ms * (0.5 + Math.random() / 2));   // spread the retries

function bump(attr) {
  document.body.dataset[attr] = String(Number(document.body.dataset[attr] || 0) + 1);
}

// The transports the page may use, fastest first, from <body data-poll-mode>
// (settings.PLURKWEB_POLL_MODE or ?poll=stream|long|short); "edge" needs <body data-edge-url>.
function transports() {
  const mode = document.body.dataset.pollMode;
  return mode === "short" ? ["short"] : mode === "long" ? ["long", "short"] : ["edge", "stream", "long", "short"];
}

function onState(state) {
  document.body.dataset.transport = state;
  if (state !== "edge" && state !== "stream") live.stream = null;
  if (state === "ended") location.href = "/login";  // the site said 401: logged out
}

function onWire(info) {
  if (info.type === "poll") {
    if (info.cache === "HIT") bump("pollHits");
    else if (info.cache === "MISS") bump("pollMisses");
    if (info.held) bump("pollHeld");
    $("offline").hidden = info.status > 0 && info.status < 500;     // no answer, or nginx's 5xx
  } else if (info.type === "open") {
    live.stream = { source: info.source };
    bump("streamOpens");
  } else if (info.type === "event") {
    bump("streamEvents");
    if (info.resource === "getMessages") bump("streamMessages");
    $("offline").hidden = true;
  } else if (info.type === "miss") {
    bump("streamMisses");
  }
}

function onAnswer(resource, data) {
  if (resource === "getUnreadCount") {
    setBadge(data ? data.count : 0);
    return;
  }
  // getMessages: rendered in order, one answer after the other (a response may wait for its plurk)
  live.rendering = live.rendering.then(() => showMessages(data || { count: 0, items: [] })).then(() => {
    live.renderDelay = RETRY_MS;
  }, () => {
    // the plurk of a response could not be loaded: ask again for the answer, later
    $("offline").hidden = false;
    setTimeout(pollNow, jitter(live.renderDelay));
    live.renderDelay = Math.min(live.renderDelay * 2, MAX_BACKOFF_MS);
  });
}

// Ask the client again, now, for the current answers (a held poll is dropped, a stream reopened).
function pollNow() {
  if (live.sub) live.sub.wake();
}

function follow() {
  const timeline = Boolean($("timeline"));       // other pages show the badge alone
  live.sub = fastpoll.subscribe(timeline ? ["getUnreadCount", "getMessages"] : ["getUnreadCount"], onAnswer,
                                { edge: document.body.dataset.edgeUrl || "", transports: transports(),
                                  onState, onWire });
}

function setBadge(count) {
  $("badge-count").textContent = String(count);
  $("badge").hidden = count === 0;
  document.title = (count ? `(${count}) ` : "") + document.title.replace(/^\(\d+\) /, "");
}

// One getMessages answer ({count, items}) on the page.
async function showMessages(data) {
  let plurks = 0, responses = 0, newest = 0;
  for (const item of data.items) {
    newest = Math.max(newest, item.id);
    if (item.kind === "plurk") {
      if (!$(`plurk-${item.id}`)) { insertPlurk(plurkNode({ ...item, response_count: 0 }, true)); plurks++; }
      continue;
    }
    let host = $(`plurk-${item.plurk_id}`);
    if (!host) {                                    // a response to a plurk not on the page: show it
      const loaded = plurkNode(await api("GET", `/api/plurks/${item.plurk_id}`), false);
      host = $(`plurk-${item.plurk_id}`);           // "Older plurks" may have brought it meanwhile
      if (!host) insertPlurk(host = loaded);
    }
    if (!host.querySelector(`.response[data-id="${item.id}"]`)) {
      host.append(el("p", { class: "response new", "data-id": item.id }, "↳ ", el("strong", {}, item.author),
                     " ", item.content));
      responses++;
    }
  }
  // everything unread up to `newest` is on the page now, unless getMessages left older items out
  live.complete = data.count <= data.items.length;
  if (newest > live.shownUpto) { live.shownUpto = newest; live.readDue = Date.now() + READ_AFTER_MS; }
  readLater();
  $("unread-more").hidden = live.complete;
  $("unread-more-text").textContent = `Not shown: ${plural(data.count - data.items.length, "older unread item")}.`;
  const news = [plurks && plural(plurks, "new plurk"), responses && plural(responses, "new response")];
  if (plurks || responses) $("live-status").textContent = news.filter(Boolean).join(", ");
}

function readable() {
  const seen = document.visibilityState === "visible" && Date.now() >= live.readDue;
  return live.shownUpto > live.readUpto && (live.markAll || (live.complete && seen));
}

// Marks read once what is shown has been visible for READ_AFTER_MS (or "Mark all as read").
function readLater(delay) {
  clearTimeout(live.readTimer);
  if (live.shownUpto <= live.readUpto) return;
  live.readTimer = setTimeout(readNow, delay !== undefined ? delay : Math.max(0, live.readDue - Date.now()) + 50);
}

async function readNow() {
  if (live.reading || !readable()) return;         // a hidden tab reads once it is visible again
  live.reading = true;
  let failed = false;
  try {
    await markRead();
  } catch (e) {
    failed = true;
    $("offline").hidden = false;
  }
  live.reading = false;
  readLater(failed ? jitter(RETRY_MS * 2) : undefined);   // and what came meanwhile
}

async function markRead() {
  const upto = live.shownUpto, all = live.markAll;
  live.markAll = false;                             // a click while this one is sent counts again
  let data;
  try {
    data = await api("POST", "/api/markRead", { upto });        // then the client asks again (pollNow)
  } catch (e) {
    live.markAll = live.markAll || all;
    throw e;
  }
  live.readUpto = Math.max(live.readUpto, upto);
  live.complete = true;
  $("unread-more").hidden = true;
  $("offline").hidden = true;
  setBadge(data.count);
}

document.addEventListener("visibilitychange", () => {
  if (document.visibilityState !== "visible") return;
  live.readDue = Math.max(live.readDue, Date.now() + READ_AFTER_MS);   // read only what was seen
  readLater();
});
window.addEventListener("online", pollNow);

// Load a page's data, retrying with back-off (and the offline notice) until it works; then follow.
async function start(load) {
  for (let delay = RETRY_MS; ; delay = Math.min(delay * 2, MAX_BACKOFF_MS)) {
    try {
      await load();
      break;
    } catch (e) {
      if (e.status === 401) { location.href = "/login"; return; }
      $("offline").hidden = false;
      await new Promise((resolve) => setTimeout(resolve, delay));
    }
  }
  $("offline").hidden = true;
  follow();
}

// ---- pages ---------------------------------------------------------------------------------

async function whoami() {
  const me = await api("GET", "/api/me");           // a 401 sends start() to the login page
  $("whoami").textContent = `@${me.username}`;
  $("logout").hidden = false;
  return me;
}

function timelinePage() {
  const form = $("post-form"), content = $("post-content"), counter = $("post-counter");
  const updateCounter = () => {
    const left = checkLength(content);
    counter.textContent = left >= 0 ? `${plural(left, "character")} left`
                                    : `${plural(-left, "character")} over the limit`;
    // the counter is read with the box (aria-describedby); announce only on reaching or passing the limit
    const level = left < 0 ? "over" : left <= NEAR_LIMIT ? "near" : "";
    if (level !== (counter.dataset.level || "")) {
      counter.dataset.level = level;
      $("post-alert").textContent = level ? counter.textContent : "";
    }
  };
  content.addEventListener("input", updateCounter);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const p = await api("POST", "/api/plurks", { content: content.value });
      if (!$(`plurk-${p.id}`)) insertPlurk(plurkNode(p, false));
      content.value = ""; updateCounter(); $("post-error").hidden = true;
    } catch (e) { $("post-error").textContent = e.message; $("post-error").hidden = false; }
  });
  let before = null;
  const loadPage = async () => {
    const data = await api("GET", "/api/timeline?limit=20" + (before ? `&before=${before}` : ""));
    for (const p of data.items) if (!$(`plurk-${p.id}`)) insertPlurk(plurkNode(p, false));
    before = data.next;
    $("more").hidden = !before;
  };
  const offline = () => { $("offline").hidden = false; };
  $("more").addEventListener("click", () => loadPage().catch(offline));
  $("mark-all").addEventListener("click", () => { live.markAll = true; readLater(0); });
  start(async () => { await whoami(); await loadPage(); });
}

function userPage() {
  const name = $("profile").dataset.username;
  const load = async () => {
    await whoami();
    let u;
    try {
      u = await api("GET", `/api/users/${encodeURIComponent(name)}`);
    } catch (e) {
      if (e.status !== 404) throw e;
      $("profile-stats").textContent = "No such user.";
      return;
    }
    $("profile-stats").textContent = `${u.followers} followers · following ${u.following}`;
    const btn = $("follow");
    const label = () => { btn.textContent = u.is_following ? "Unfollow" : "Follow"; };
    label();
    btn.hidden = false;
    btn.addEventListener("click", async () => {
      try {
        if (u.is_following) await api("DELETE", `/api/follow/${encodeURIComponent(name)}`);
        else await api("POST", "/api/follow", { username: name });
        u.is_following = !u.is_following; label();
      } catch (e) { $("profile-stats").textContent = e.message; }
    });
    for (const p of u.plurks) $("profile-plurks").append(plurkNode(p, false));
  };
  start(load);
}

function authPage() {
  const form = $("auth-form");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await api("POST", `/api/${form.dataset.action}`, { username: $("username").value, password: $("password").value });
      location.href = "/";
    } catch (e) { $("auth-error").textContent = e.message; $("auth-error").hidden = false; }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("logout").addEventListener("click", async () => {
    try { await api("POST", "/api/logout"); } finally { location.href = "/login"; }
  });
  const page = document.body.dataset.page;
  if (page === "timeline") timelinePage();
  else if (page === "user") userPage();
  else authPage();
});
