// plurk web client: plain JavaScript over plurkcore's JSON API and the /Poll/ endpoints.
"use strict";

const POLL_MS = 2000, MAX_BACKOFF_MS = 30000, READ_AFTER_MS = 3000;
// Long-polling (docs/web.md): fastpath holds a poll up to WAIT_S seconds while nothing changes.
// A held answer that came back sooner than QUICK_MS without a change re-polls after POLL_MS, so
// a server that stops holding can never make the page spin.
const WAIT_S = 50, QUICK_MS = 1000;
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
  // a write of ours (markRead, follow) may bring the count back to the number our ETag holds, with
  // other items: the next poll must not be held as "nothing new", and a poll held now asked with
  // that ETag, so it is woken to ask again without it
  if (method !== "GET") {
    live.etag = null;
    live.reopen = true;                             // a stream is asked again too (its first event)
    if (live.held) live.held.abort();
  }
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
// Every tick asks for the unread count (pollCount) and sets the badge.  Only the timeline page
// goes further: it renders getMessages' items (showMessages; fetching the plurk of a response that
// is not on the page), and once they have been visible for READ_AFTER_MS marks read up to the
// newest rendered id.  On a stream the messages come with the count, as the stream's getMessages
// events (one stream of both resources); on a poll the page fetches /Poll/getMessages whenever the
// count differs from the count it has fully rendered (live.known).  Ticks never overlap, so a
// markRead cannot race a fetch.  Other pages only show the badge (their stream carries the count
// alone).  getMessages returns the newest 50: when more are unread the older ones cannot be
// shown, so nothing is marked read until the person asks for it ("Mark all as read").
//
// How the count arrives: the transports (docs/web.md), fastest first, from <body data-poll-mode>
// (settings.PLURKWEB_POLL_MODE or ?poll=stream|long|short) and <body data-edge-url>:
//
//   "edge"    an EventSource on the edge (fastpath's listener on another origin, CORS with
//             credentials), when data-edge-url is set;
//   "stream"  an EventSource on /Poll/getUnreadCount through nginx (fastpath's stream, or
//             Django's one event and `retry:` when nginx hands it to Django);
//             on the timeline both streams are of /Poll/getUnreadCount,getMessages (streamPath);
//   "long"    one getUnreadCount in flight with `Prefer: wait` and `If-None-Match: <its last
//             ETag>`: fastpath holds it until the count changes (200/204) or the wait ends (304),
//             and says so with Preference-Applied; the page then polls again at once.  An answer
//             without Preference-Applied came from Django (fastpath down, or a miss): the page
//             waits POLL_MS, i.e. short-polls until fastpath is back;
//   "short"   a poll every POLL_MS.
//
// A stream's tick waits for its next event, as a long-poll's waits for its answer.  A transport
// that fails falls to the next one (a stream: an error before its first event, the browser giving
// up (CORS, HTTP status), or STREAM_QUICK_ENDS connections in a row that end within
// STREAM_QUICK_MS, i.e. nothing holds them; a long-poll: LONG_FAILURES errors in a row).  After
// live.retryAt (RETRY_MS, doubling to MAX_RETRY_MS while the faster one keeps failing) the page
// tries the fastest again: from a stream at once, from a poll once an answer was a fastpath HIT.
// A miss (`event: miss`; the edge also refuses a stream it cannot start) is one poll through the
// site of each resource the stream carries (nginx, where Django fills the cache), then the same
// stream again.  Marking read cannot wait for a held poll or the next event: a due read wakes it
// (pollNow) and the next tick marks read before it waits again.

const STREAM_QUICK_MS = 2000, STREAM_QUICK_ENDS = 3, LONG_FAILURES = 2;
const RETRY_MS = 5000, MAX_RETRY_MS = 300000, STREAM_PROVEN_MS = 60000;

const live = { delay: POLL_MS, timer: null, started: false, running: false, soon: false,
               known: 0, shownUpto: 0, readUpto: 0, readDue: 0, complete: true, markAll: false,
               etag: null, count: 0, held: null, next: POLL_MS, readTimer: null,
               transports: ["short"], level: 0, stream: null, reopen: false, retryAt: 0,
               retryDelay: RETRY_MS, lastHit: false, longFailures: 0, lastMiss: -Infinity,
               edgeRefused: false,
               // the tick's getMessages answer when the count came by a stream that carries them:
               // null (none new since the last tick), else the answer; undefined: fetch as polls do
               messages: undefined };

const transport = () => live.transports[live.level];
const isStream = (t) => t === "edge" || t === "stream";
// The transports that hold (streams, long-polls) wake the page themselves; short polls do not.
const holding = () => transport() !== "short";

function bump(attr) {
  document.body.dataset[attr] = String(Number(document.body.dataset[attr] || 0) + 1);
}

function countCache(resp) {
  const state = resp.headers.get("X-Cache");
  if (state === "HIT") bump("pollHits");
  else if (state === "MISS") bump("pollMisses");
  live.lastHit = state === "HIT";                   // fastpath answered: a faster transport may work again
}

async function poll(resource) {
  const resp = await fetch(`/Poll/${resource}`, { credentials: "same-origin", cache: "no-store" });
  countCache(resp);
  if (resp.status === 401) { location.href = "/login"; throw new Error("logged out"); }
  if (resp.status === 204) return { count: 0, items: [] };
  if (resp.status !== 200) throw new Error(`HTTP ${resp.status}`);
  return resp.json();
}

function chooseTransports() {
  const mode = document.body.dataset.pollMode;
  const edge = document.body.dataset.edgeUrl || "";
  const streams = typeof EventSource === "function" ? [...(edge ? ["edge"] : []), "stream"] : [];
  live.transports = mode === "short" ? ["short"] : mode === "long" ? ["long", "short"]
                                                : [...streams, "long", "short"];
  setLevel(0);
}

function setLevel(level) {
  if (isStream(transport()) && live.level !== level) closeStream();
  live.level = level;
  live.etag = null;                                 // nothing carries over from another transport
  document.body.dataset.transport = transport();
}

// The current transport failed: the next one takes over at once, and the fastest is tried again later.
function demote() {
  const s = live.stream;
  if (s && Date.now() - s.created >= STREAM_PROVEN_MS) live.retryDelay = RETRY_MS;
  if (live.level === 0) {
    live.retryAt = Date.now() + live.retryDelay;
    live.retryDelay = Math.min(live.retryDelay * 2, MAX_RETRY_MS);
  }
  live.lastHit = false;
  if (live.level < live.transports.length - 1) setLevel(live.level + 1);
  else closeStream();
}

function maybePromote() {
  if (live.level === 0 || Date.now() < live.retryAt) return;
  if (!isStream(transport()) && !live.lastHit) return;          // fastpath has not answered yet
  setLevel(0);
}

// ---- streams (Server-Sent Events, docs/contract.md sections 9 and 10)

// The timeline's stream carries its messages too (docs/contract.md section 9, several resources
// in one stream: each event is named after its resource, and the first ones are the current
// answers); other pages need the count alone.
const carriesMessages = () => Boolean($("timeline"));
const streamPath = () => carriesMessages() ? "/Poll/getUnreadCount,getMessages" : "/Poll/getUnreadCount";

function openStream(kind) {
  const path = streamPath();
  const url = kind === "edge" ? new URL(path, document.body.dataset.edgeUrl).href : path;
  const source = new EventSource(url, { withCredentials: kind === "edge" });
  // count: the last count (undefined until the first); messages: the last getMessages answer not
  // yet taken by a tick; fresh: an event came since the last tick took one
  const s = { kind, source, created: Date.now(), openedAt: null, events: 0, quick: 0,
              carries: carriesMessages(), count: undefined, messages: null, fresh: false,
              waiter: null, ended: null };
  bump("streamOpens");
  const arrived = () => {
    s.events++;
    if (kind === "edge") live.edgeRefused = false;
    bump("streamEvents");
    if (s.waiter) { const w = s.waiter; s.waiter = null; w.resolve(); } else s.fresh = true;
  };
  source.addEventListener("open", () => { s.openedAt = Date.now(); });
  source.addEventListener("getUnreadCount", (ev) => {
    let count;
    try { count = ev.data === "" ? 0 : JSON.parse(ev.data).count; } catch (e) { count = undefined; }
    if (!Number.isInteger(count)) { endStream(s, "failed"); return; }
    s.count = count;
    arrived();
  });
  if (s.carries) source.addEventListener("getMessages", (ev) => {
    let data;
    try { data = ev.data === "" ? { count: 0, items: [] } : JSON.parse(ev.data); } catch (e) { data = null; }
    if (!data || !Number.isInteger(data.count) || !Array.isArray(data.items)) { endStream(s, "failed"); return; }
    s.messages = data;
    bump("streamMessages");
    arrived();
  });
  source.addEventListener("miss", () => endStream(s, "miss"));
  source.addEventListener("error", () => {
    // Each end of a connection: EventSource reconnects by itself (with Last-Event-ID), unless it
    // gave up (CLOSED).  Failed: it gave up, nothing ever came, a reconnect did not even connect
    // (nothing answers there now), or the connections keep ending at once (nothing holds them:
    // Django's one event and `retry:` each time, while fastpath is down).
    const lived = s.openedAt === null ? -1 : Date.now() - s.openedAt;
    s.openedAt = null;
    s.quick = lived < STREAM_QUICK_MS ? s.quick + 1 : 0;
    if (source.readyState === EventSource.CLOSED || s.events === 0 || lived < 0 ||
        s.quick >= STREAM_QUICK_ENDS) endStream(s, "failed");
  });
  return s;
}

function endStream(s, why) {
  s.source.close();
  if (!s.ended) s.ended = why;
  if (s.waiter) {
    const w = s.waiter;
    s.waiter = null;
    w.reject(Object.assign(new Error(`stream ${why}`), { why }));
  }
}

function closeStream() {
  if (live.stream) endStream(live.stream, "closed");
  live.stream = null;
}

// What the stream brought since the last tick: its count, and (live.messages) the getMessages
// answer that came with it, if any.
function streamTaken(s) {
  s.fresh = false;
  if (s.carries) { live.messages = s.messages; s.messages = null; }
  return s.count === undefined ? live.count : s.count;
}

// The stream's next answer: what came since the last tick, else the next event to come.
async function streamCount(kind) {
  if (live.reopen) { closeStream(); live.reopen = false; }   // its first events are the current answers
  if (!live.stream) live.stream = openStream(kind);
  const s = live.stream;
  if (s.fresh) return streamTaken(s);
  if (s.ended) throw Object.assign(new Error(`stream ${s.ended}`), { why: s.ended });
  try {
    await new Promise((resolve, reject) => {
      s.waiter = { resolve, reject };
      live.held = { abort: () => {                  // pollNow: the tick goes on; the stream stays open
        if (!s.waiter) return;
        s.waiter = null;
        reject(new DOMException("woken", "AbortError"));
      } };
    });
  } finally { live.held = null; }
  return streamTaken(s);
}

// ---- polls

// The unread count, by the current transport.  Sets live.next, the delay before the next tick
// (0: the transport holds, ask again at once).
async function pollCount() {
  maybePromote();
  live.messages = undefined;
  const t = transport();
  if (isStream(t)) {
    live.next = 0;
    try {
      live.count = await streamCount(t);
      return live.count;
    } catch (e) {
      if (e.name === "AbortError") throw e;
      closeStream();
      // A miss: ask the site once (Django fills the cache), then the stream again.  The edge
      // refuses a stream it cannot start with a 409, which EventSource cannot read: its first
      // refusal is taken for a miss, a second one in a row for a failure.
      const miss = e.why === "miss" || (t === "edge" && e.why === "failed" && !live.edgeRefused);
      if (miss) {
        if (t === "edge" && e.why === "failed") live.edgeRefused = true;
        bump("streamMisses");
        const now = Date.now();
        live.next = now - live.lastMiss < 10 * POLL_MS ? POLL_MS : 0;    // a miss again: slow down
        live.lastMiss = now;
        live.count = (await poll("getUnreadCount")).count;
        // the timeline's stream carries the messages too: their key may be the one that went
        if (carriesMessages()) live.messages = await poll("getMessages");
        return live.count;
      }
      demote();
      return pollCount();
    }
  }
  if (t === "short") {
    live.next = POLL_MS;
    live.count = (await poll("getUnreadCount")).count;
    return live.count;
  }
  try {
    const count = await longPollCount();
    live.longFailures = 0;
    return count;
  } catch (e) {
    if (e.name !== "AbortError" && ++live.longFailures >= LONG_FAILURES) { live.longFailures = 0; demote(); }
    throw e;
  }
}

async function longPollCount() {
  // below a stream, hold only until the stream is due to be tried again: an answer from fastpath
  // after that (X-Cache: HIT) brings the stream back
  let wait = WAIT_S;
  if (live.level > 0) wait = Math.min(wait, Math.ceil((live.retryAt - Date.now()) / 1000));
  const headers = {};
  if (wait > 0) headers.Prefer = `wait=${wait}`;
  const sent = live.etag;                           // a write may clear live.etag while we wait
  if (sent) headers["If-None-Match"] = sent;
  const began = Date.now();
  live.held = new AbortController();
  let resp;
  try {
    // no-store: the 304 is ours to see, not the HTTP cache's
    resp = await fetch("/Poll/getUnreadCount", { credentials: "same-origin", cache: "no-store",
                                                 headers, signal: live.held.signal });
  } finally { live.held = null; }
  countCache(resp);
  if (resp.status === 401) { location.href = "/login"; throw new Error("logged out"); }
  let count = live.count;
  if (resp.status === 200) count = (await resp.json()).count;
  else if (resp.status === 204) count = 0;
  else if (resp.status !== 304 || !sent) throw new Error(`HTTP ${resp.status}`);
  live.etag = resp.headers.get("ETag");
  live.count = count;
  const held = resp.headers.has("Preference-Applied");
  if (held) bump("pollHeld");
  live.next = held && (resp.status !== 304 || Date.now() - began >= QUICK_MS) ? 0 : POLL_MS;
  return count;
}

function readable() {
  const seen = document.visibilityState === "visible" && Date.now() >= live.readDue;
  return live.shownUpto > live.readUpto && (live.markAll || (live.complete && seen));
}

function setBadge(count) {
  $("badge-count").textContent = String(count);
  $("badge").hidden = count === 0;
  document.title = (count ? `(${count}) ` : "") + document.title.replace(/^\(\d+\) /, "");
}

async function tick() {
  if (holding() && $("timeline") && readable()) await markRead();    // before a hold, not after it
  const count = await pollCount();
  setBadge(count);
  if (!$("timeline")) return;                       // nothing is shown here, so nothing is read
  // The count came by a stream that carries the messages (or a miss asked the site for both):
  // what came is rendered as it is and nothing is fetched; messages behind the count come as the
  // stream's next getMessages event (it sends every change of either key).
  const carried = live.messages;
  live.messages = undefined;
  if (carried) {
    try { await showMessages(carried); } catch (e) { live.reopen = true; throw e; }   // asked again
  }
  if (count === 0) { live.known = 0; return; }
  if (carried === undefined && count !== live.known) {
    await fetchMessages();
    // The messages are behind the count that announced them: two keys, written one after the
    // other, and the count was read first.  Holding on the count's ETag (or waiting for the
    // stream's next event) would show them only at the next change; ask again after the short
    // interval instead.
    if (live.known < count) { live.etag = null; live.reopen = true; live.next = POLL_MS; }
  }
  if (readable()) await markRead();
}

async function fetchMessages() {
  await showMessages(await poll("getMessages"));
}

// One getMessages answer ({count, items}), from a poll or a stream's event, on the page.
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
      host = plurkNode(await api("GET", `/api/plurks/${item.plurk_id}`), false);
      insertPlurk(host);
    }
    if (!host.querySelector(`.response[data-id="${item.id}"]`)) {
      host.append(el("p", { class: "response new", "data-id": item.id }, "↳ ", el("strong", {}, item.author),
                     " ", item.content));
      responses++;
    }
  }
  // everything unread up to `newest` is on the page now, unless getMessages left older items out
  live.known = data.count;
  live.complete = data.count <= data.items.length;
  if (newest > live.shownUpto) { live.shownUpto = newest; live.readDue = Date.now() + READ_AFTER_MS; readLater(); }
  $("unread-more").hidden = live.complete;
  $("unread-more-text").textContent = `Not shown: ${plural(data.count - data.items.length, "older unread item")}.`;
  const news = [plurks && plural(plurks, "new plurk"), responses && plural(responses, "new response")];
  if (plurks || responses) $("live-status").textContent = news.filter(Boolean).join(", ");
}

async function markRead() {
  const upto = live.shownUpto;
  const data = await api("POST", "/api/markRead", { upto });
  live.readUpto = Math.max(live.readUpto, upto);
  live.known = 0;            // what is still unread is newer than anything shown: the next tick fetches it
  live.complete = true;
  live.markAll = false;
  $("unread-more").hidden = true;
  setBadge(data.count);
}

// A long-poll is held while nothing changes: when something shown becomes due for reading, wake it.
function readLater() {
  if (!holding()) return;
  clearTimeout(live.readTimer);
  live.readTimer = setTimeout(() => { if (live.shownUpto > live.readUpto) pollNow(); },
                              Math.max(0, live.readDue - Date.now()) + 50);
}

const jitter = (ms) => Math.round(ms * (0.5 + Math.random() / 2));   // spread the reconnects

function schedulePoll(delay) {
  clearTimeout(live.timer);
  if (live.running) live.soon = true;               // the running tick schedules the next one
  else live.timer = setTimeout(runTick, delay);
}

async function runTick() {
  live.running = true;
  let next;
  try {
    await tick();
    $("offline").hidden = true;
    live.delay = document.visibilityState === "visible" ? POLL_MS : Math.min(live.delay * 2, MAX_BACKOFF_MS);
    next = holding() ? live.next : live.delay;
  } catch (e) {
    if (e.name === "AbortError") {                  // pollNow woke a held poll: not an error
      next = 0;
    } else {
      $("offline").hidden = false;
      live.delay = Math.min(Math.max(live.delay, POLL_MS) * 2, MAX_BACKOFF_MS);
      next = jitter(live.delay);
    }
  }
  live.running = false;
  const soon = live.soon;
  live.soon = false;
  schedulePoll(soon ? 0 : next);
}

function pollNow() {
  if (!live.started) return;
  live.delay = POLL_MS;
  schedulePoll(0);
  if (live.held) live.held.abort();                 // the tick that held it polls again at once
}

document.addEventListener("visibilitychange", () => {
  if (document.visibilityState !== "visible") return;
  live.readDue = Math.max(live.readDue, Date.now() + READ_AFTER_MS);   // read only what was seen
  pollNow();
});
window.addEventListener("online", pollNow);

// Load a page's data, retrying with back-off (and the offline notice) until it works; then poll.
async function start(load) {
  for (let delay = POLL_MS; ; delay = Math.min(delay * 2, MAX_BACKOFF_MS)) {
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
  chooseTransports();
  live.started = true;
  schedulePoll(0);
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
  $("mark-all").addEventListener("click", () => { live.markAll = true; pollNow(); });
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
