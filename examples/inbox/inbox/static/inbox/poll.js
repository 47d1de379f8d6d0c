// The page's long-poll loop (docs/contract.md, "The answer"): GET `url` (the poll cookie set by
// fastpoll's middleware goes with it) with the last ETag and `Prefer: wait`; fastpath holds it
// until the answer's ETag changes.  `show(answer)` gets the JSON of a 200, or `empty` for a 204
// (nothing new).  A 401 (logged out) or 403 (no longer allowed) ends the loop.
//
// When to ask again: at once only after an answer fastpath held (it says Preference-Applied) that
// changed or took QUICK_MS; any other answer (Django's, which never holds: fastpath or memcached is
// down) after POLL_MS, so a page never spins; an error (502/503/504, no network) after a back-off
// that doubles up to MAX_BACKOFF_MS, jittered so that pages do not all come back at once.
const POLL_MS = 2000, QUICK_MS = 1000, MAX_BACKOFF_MS = 30000;

function longPoll(url, empty, show) {
  let etag = null, backoff = POLL_MS;
  async function poll() {
    let next;
    try {
      const began = Date.now();
      const r = await fetch(url, {cache: "no-store",
                                  headers: Object.assign({"Prefer": "wait=25"}, etag ? {"If-None-Match": etag} : {})});
      if (r.status === 401 || r.status === 403) return;
      if (r.status === 200 || r.status === 204) {
        etag = r.headers.get("ETag");
        show(r.status === 200 ? await r.json() : empty);
      } else if (r.status !== 304) throw new Error(`HTTP ${r.status}`);
      const held = r.headers.has("Preference-Applied") && (r.status !== 304 || Date.now() - began >= QUICK_MS);
      next = held ? 0 : POLL_MS;
      backoff = POLL_MS;
    } catch (e) {
      next = Math.round(backoff * (0.5 + Math.random() / 2));
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    }
    setTimeout(poll, next);
  }
  poll();
}

function showList(id, items) {
  document.getElementById(id).replaceChildren(...items.map(item => {
    const li = document.createElement("li"); li.textContent = item.text; return li; }));
}
