// The page's long-poll loop: GET `url` (the poll cookie set by fastpoll's middleware goes with it);
// fastpath holds it until the answer's ETag changes.  `show(answer)` gets the JSON of a 200, or
// `empty` for a 204 (nothing new).  A 401 (logged out) or 403 (no longer allowed) ends the loop.
function longPoll(url, empty, show) {
  let etag = null;
  async function poll() {
    try {
      const r = await fetch(url, {headers: Object.assign({"Prefer": "wait=25"}, etag ? {"If-None-Match": etag} : {})});
      if (r.status === 401 || r.status === 403) return;
      if (r.status === 200 || r.status === 204) {
        etag = r.headers.get("ETag");
        show(r.status === 200 ? await r.json() : empty);
      }
    } catch (e) { await new Promise(ok => setTimeout(ok, 2000)); }
    setTimeout(poll, 0);
  }
  poll();
}

function showList(id, items) {
  document.getElementById(id).replaceChildren(...items.map(item => {
    const li = document.createElement("li"); li.textContent = item.text; return li; }));
}
