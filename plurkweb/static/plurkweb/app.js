// plurk web client: plain JavaScript over plurkcore's JSON API and the /Poll/ endpoints.
"use strict";

const POLL_MS = 2000, MAX_BACKOFF_MS = 30000, READ_AFTER_MS = 3000;
const $ = (id) => document.getElementById(id);

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
    for (const r of data.responses) list.append(responseNode(r));
    const input = el("input", { "aria-label": "Your response", maxlength: "360", required: "" });
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

const live = { delay: POLL_MS, lastCount: -1, maxSeen: 0, timer: null, readTimer: null };

function countCache(resp) {
  const state = resp.headers.get("X-Cache");
  const attr = state === "HIT" ? "pollHits" : state === "MISS" ? "pollMisses" : null;
  if (attr) document.body.dataset[attr] = String(Number(document.body.dataset[attr]) + 1);
}

async function pollOnce() {
  const resp = await fetch("/Poll/getUnreadCount", { credentials: "same-origin" });
  countCache(resp);
  if (resp.status === 401) { location.href = "/login"; return; }
  if (resp.status !== 200 && resp.status !== 204) throw new Error(`HTTP ${resp.status}`);
  const count = resp.status === 204 ? 0 : (await resp.json()).count;
  setBadge(count);
  if (count > 0 && count !== live.lastCount) await fetchMessages();
  live.lastCount = count;
}

function setBadge(count) {
  const badge = $("badge");
  badge.textContent = String(count);
  badge.hidden = count === 0;
  document.title = (count ? `(${count}) ` : "") + document.title.replace(/^\(\d+\) /, "");
}

async function fetchMessages() {
  const resp = await fetch("/Poll/getMessages", { credentials: "same-origin" });
  countCache(resp);
  if (resp.status === 204) return;
  if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
  const data = await resp.json();
  const timeline = $("timeline");
  for (const item of data.items.slice().reverse()) {          // oldest first, so newest ends on top
    live.maxSeen = Math.max(live.maxSeen, item.id);
    if (item.kind === "plurk" && timeline && !$(`plurk-${item.id}`)) {
      timeline.prepend(plurkNode({ ...item, response_count: 0 }, true));
    } else if (item.kind === "response") {
      const host = $(`plurk-${item.plurk_id}`);
      if (host && !host.querySelector(`.response[data-id="${item.id}"]`)) {
        host.append(el("p", { class: "response new" }, "↳ ", el("strong", {}, item.author), " ", item.content));
      }
    }
  }
  scheduleMarkRead();
}

function scheduleMarkRead() {
  clearTimeout(live.readTimer);
  live.readTimer = setTimeout(async () => {
    if (document.visibilityState !== "visible" || !live.maxSeen) return;
    try {
      const data = await api("POST", "/api/markRead", { upto: live.maxSeen });
      setBadge(data.count);
      live.lastCount = data.count;
    } catch (e) { /* the next poll shows the badge again; nothing is lost */ }
  }, READ_AFTER_MS);
}

function schedulePoll() {
  clearTimeout(live.timer);
  live.timer = setTimeout(async () => {
    try {
      await pollOnce();
      $("offline").hidden = true;
      live.delay = document.visibilityState === "visible" ? POLL_MS : Math.min(live.delay * 2, MAX_BACKOFF_MS);
    } catch (e) {
      $("offline").hidden = false;
      live.delay = Math.min(Math.max(live.delay, POLL_MS) * 2, MAX_BACKOFF_MS);
    }
    schedulePoll();
  }, live.delay);
}

document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") { live.delay = 0; schedulePoll(); live.delay = POLL_MS; }
});
window.addEventListener("online", () => { live.delay = 0; schedulePoll(); live.delay = POLL_MS; });

// ---- pages ---------------------------------------------------------------------------------

async function whoami() {
  try {
    const me = await api("GET", "/api/me");
    $("whoami").textContent = `@${me.username}`;
    $("logout").hidden = false;
    return me;
  } catch (e) {
    if (e.status === 401) { location.href = "/login"; return null; }
    $("offline").hidden = false;
    return null;
  }
}

async function timelinePage() {
  const me = await whoami();
  if (!me) return;
  const form = $("post-form"), content = $("post-content"), counter = $("post-counter");
  const updateCounter = () => { counter.textContent = `${360 - content.value.length} characters left`; };
  content.addEventListener("input", updateCounter);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const p = await api("POST", "/api/plurks", { content: content.value });
      $("timeline").prepend(plurkNode(p, false));
      content.value = ""; updateCounter(); $("post-error").hidden = true;
    } catch (e) { $("post-error").textContent = e.message; $("post-error").hidden = false; }
  });
  let before = null;
  const loadPage = async () => {
    const data = await api("GET", "/api/timeline?limit=20" + (before ? `&before=${before}` : ""));
    for (const p of data.items) if (!$(`plurk-${p.id}`)) $("timeline").append(plurkNode(p, false));
    before = data.next;
    $("more").hidden = !before;
  };
  $("more").addEventListener("click", loadPage);
  await loadPage();
  schedulePoll();
}

async function userPage() {
  await whoami();
  const name = $("profile").dataset.username;
  try {
    const u = await api("GET", `/api/users/${encodeURIComponent(name)}`);
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
  } catch (e) { $("profile-stats").textContent = e.status === 404 ? "No such user." : e.message; }
  schedulePoll();
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
