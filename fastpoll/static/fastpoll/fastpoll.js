/* fastpoll.js: fastpoll's browser client (docs/integrate.md, section 5).  No dependency, no build.
 *
 *   {% load static %}<!-- the template hands the page's script what it needs in data- attributes -->
 *   <body data-edge-url="{{ edge_url }}" data-poll-prefix="{{ fastpoll_prefix }}">
 *     <script src="{% static 'fastpoll/fastpoll.js' %}"></script>
 *     <script src="{% static 'myapp/inbox.js' %}"></script>
 *   </body>
 *
 *   // myapp/static/myapp/inbox.js: a static file, not an inline <script>, which the CSP the edge
 *   // needs (default-src 'self', docs/integrate.md section 7) blocks
 *   const page = document.body.dataset;            // data-edge-url, data-poll-prefix
 *   const sub = fastpoll.subscribe(["inbox"], (resource, answer) => show(answer),
 *                                  {edge: page.edgeUrl, prefix: page.pollPrefix, empty: {unread: 0}});
 *
 * fastpoll.subscribe(resources, onAnswer, options) -> {close(), wake(), state}
 *
 *   resources   1 to 4 per-user resource names (["getUnreadCount", "getMessages"]: one stream
 *               carries them all), or one per-object poll path with its capability, as
 *               fastpoll.capability_url() gives it ("/Poll/board/7?cap=c1...").
 *   onAnswer(resource, answer)   each new answer: the resource's name, and the parsed JSON of a
 *               200 or options.empty for an empty answer (a 204).  An answer is given once: one
 *               whose ETag was given already is not given again, whichever transport brings it.
 *   options.edge        fastpoll.edge_url(request): the edge's origin; "" (default): no edge
 *   options.prefix      FASTPOLL["PATH_PREFIX"] ("/Poll/")
 *   options.transports  fastest first (["edge", "stream", "long", "short"]): "edge" an EventSource
 *               on the edge (with credentials), "stream" one on the site, "long" long-polls of the
 *               site, "short" a poll of the site every 2 s
 *   options.empty       what an empty answer is given as (null)
 *   options.wait        a long-poll's Prefer: wait, in seconds (50; fastpath holds at most its
 *               --max-wait, FASTPOLL["LONGPOLL_MAX_WAIT"])
 *   options.onState(state)  the transport in use, each time it changes; "ended" when the site
 *               answered 401 (logged out) or 403 (no longer allowed): nothing is polled after it;
 *               "refused" when the site answered 404 for a poll path: the page is misconfigured (an
 *               unknown resource, or options.prefix is not PATH_PREFIX; a miss is never a 404), one
 *               console error names the path, options.prefix and the resource, nothing is polled
 *               after it (the edge's 404, a path it does not serve, is an edge refusal as below);
 *               "closed" after close()
 *   options.onWire(info)    what goes over the wire, for counters and logs: {type: "poll", resource,
 *               status, cache, held} after each poll (status 0: no answer, the network failed;
 *               cache: its X-Cache, "HIT" when fastpath answered; held: fastpath held it,
 *               Preference-Applied), {type: "open", transport, source} each EventSource opened
 *               (source: the EventSource), {type: "event", transport, resource} each event of a
 *               resource a stream brings (before the ETag check), {type: "miss", transport} each
 *               miss of a stream (an `event: miss`, or the edge's refusal taken for one)
 *
 *   handle.wake()   ask again now, for the current answers: held or waiting polls are asked again
 *               at once without If-None-Match, a stream is opened again (its first events are the
 *               current answers), and the next answer of each resource is given even if it was
 *               given already.  For after a write of the page's own (it may bring an answer back
 *               to bytes given before, which a held poll or a stream would not bring again), and
 *               when the network is back (window "online").  Nothing after close(), "ended" or "refused".
 *   handle.close()  stop: nothing is polled after it
 *
 * How (the wire rules are docs/contract.md's, sections 6, 7, 9 and 10):
 * - A stream (EventSource) reconnects by itself with Last-Event-ID.  `event: miss` (the key is not
 *   in memcached) is one poll of the site per resource (Django fills the cache), then the same
 *   stream again.  A stream that fails (the browser gives up: CORS, an HTTP status; nothing ever
 *   came; a reconnect that does not connect; STREAM_QUICK_ENDS ends in a row within
 *   STREAM_QUICK_MS, i.e. Django's one-event streams while fastpath is down) hands over to the
 *   next transport at once.  On the edge the first such failure is taken for a miss (a 401 there
 *   may only mean the cookie does not reach it: the site's answer decides, and its 401 ends),
 *   a second in a row for a failure.  A stream that fails at the last transport of
 *   options.transports asks the site too (EventSource does not tell a status: the site's 401,
 *   403 or 404 ends it), then opens again after a back-off.
 * - A long-poll sends the last ETag as If-None-Match and Prefer: wait.  It asks again at once only
 *   after an answer fastpath held (Preference-Applied) that changed or took QUICK_MS; any other
 *   answer came from Django (fastpath or memcached down), so it waits POLL_MS.  Errors (5xx, no
 *   network) back off from POLL_MS doubling to MAX_BACKOFF_MS, jittered; LONG_FAILURES in a row
 *   hand over to the next transport.  A 429 (a hold beyond fastpath's --max-held-per-user: other
 *   tabs of the user hold its share) hands over to short polls after its Retry-After (they do
 *   not count toward the cap; a stream refused with a 429 fails, as above, down to the
 *   long-poll's); without "short" in options.transports it waits Retry-After and asks again.
 * - The fastest transport is tried again RETRY_MS after it failed (doubling to MAX_RETRY_MS while
 *   it keeps failing): from a stream at that moment, from a poll once an answer came from
 *   fastpath (X-Cache: HIT).
 */
(function () {
  "use strict";
  const POLL_MS = 2000, QUICK_MS = 1000, MAX_BACKOFF_MS = 30000, WAIT_S = 50;
  const STREAM_QUICK_MS = 2000, STREAM_QUICK_ENDS = 3, LONG_FAILURES = 2, MISS_AGAIN_MS = 20000;
  const RETRY_MS = 5000, MAX_RETRY_MS = 300000, STREAM_PROVEN_MS = 60000;
  const TRANSPORTS = ["edge", "stream", "long", "short"];

  const jitter = (ms) => Math.round(ms * (0.5 + Math.random() / 2));    // pages must not come back at once
  const isStream = (t) => t === "edge" || t === "stream";
  const report = (e) => setTimeout(() => { throw e; });                 // to the console; the client goes on

  function refuse(why) {
    throw new Error("fastpoll.subscribe: " + why);
  }

  // [{name, path}]: the resources' names (their events' names) and the paths to poll them by
  function targets(resources, prefix) {
    const list = typeof resources === "string" ? [resources] : Array.from(resources || []);
    if (list.length < 1 || list.length > 4) refuse("give 1 to 4 resource names, or one per-object poll path");
    return list.map((r) => {
      r = String(r);
      if (r.charAt(0) !== "/") {
        if (!/^[^/?,\s]+$/.test(r)) refuse(`${JSON.stringify(r)} is no resource name`);
        return { name: r, path: prefix + r };
      }
      if (list.length > 1) refuse("a per-object poll path is subscribed to alone");
      if (r.indexOf(prefix) !== 0) refuse(`the path ${r} is not under the prefix ${prefix} (options.prefix)`);
      return { name: r.slice(prefix.length).split(/[/?]/)[0], path: r };
    });
  }

  function subscribe(resources, onAnswer, options) {
    const opts = options || {};
    const prefix = opts.prefix || "/Poll/";
    const edge = String(opts.edge || "").replace(/\/+$/, "");
    const empty = opts.empty === undefined ? null : opts.empty;
    const waitS = opts.wait || WAIT_S;
    const onState = opts.onState || function () {};
    const onWire = opts.onWire || function () {};
    const items = targets(resources, prefix);
    if (typeof onAnswer !== "function") refuse("onAnswer must be a function (resource, answer)");
    const streamPath = items.length > 1 ? prefix + items.map((item) => item.name).join(",") : items[0].path;
    const streams = typeof EventSource === "function";
    const ladder = (opts.transports || TRANSPORTS).filter((t) =>
      t === "edge" ? streams && edge : t === "stream" ? streams : t === "long" || t === "short");
    if (!ladder.length) refuse("no transport of options.transports can run here (\"edge\" needs options.edge)");

    const etags = {};                     // resource -> the ETag of the answer given last
    let level = 0, gen = 0, source = null;
    const timers = new Set(), aborters = new Set();   // the current transport's, each removed when done
    let backoff = POLL_MS, retryAt = 0, retryDelay = RETRY_MS, lastMiss = -Infinity, edgeRefused = false;
    const handle = { state: null, close: () => { stop(); setState("closed"); }, wake: wake };

    function setState(s) {
      if (s === handle.state) return;
      handle.state = s;
      try { onState(s); } catch (e) { report(e); }
    }

    function wire(info) {
      try { onWire(info); } catch (e) { report(e); }
    }

    function deliver(name, etag, text) {
      if (etag && etags[name] === etag) return;
      let answer = empty;
      if (text !== "") {
        try { answer = JSON.parse(text); } catch (e) { report(new Error(`fastpoll: ${name}'s answer is not JSON`)); return; }
      }
      etags[name] = etag;
      try { onAnswer(name, answer); } catch (e) { report(e); }
    }

    // Everything of the current transport ends: its stream, its requests, its timers.
    function stop() {
      gen++;
      if (source) source.close();
      source = null;
      timers.forEach(clearTimeout);
      aborters.forEach((a) => a.abort());
      timers.clear();
      aborters.clear();
    }

    function after(ms, g, fn) {
      const id = setTimeout(() => { timers.delete(id); if (g === gen) fn(); }, Math.max(0, ms));
      timers.add(id);
    }
    const sleep = (ms) => new Promise((resolve) => {
      if (ms <= 0) return resolve();
      const id = setTimeout(() => { timers.delete(id); resolve(); }, ms);
      timers.add(id);
    });

    function nextBackoff() {
      const ms = jitter(backoff);
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
      return ms;
    }

    function go(to, delay) {
      stop();
      level = to;
      const g = gen, t = ladder[level];
      setState(t);
      const start = () => { if (isStream(t)) openStream(t, g); else items.forEach((item) => pollLoop(item, t, g)); };
      if (delay > 0) after(delay, g, start); else start();
    }

    function end() {
      stop();
      setState("ended");
    }

    // The site answered 404 for a poll path: it has no such resource there (a miss is never a
    // 404), so the page is misconfigured; polling again would never work.
    function refused(item) {
      stop();
      console.error(`fastpoll: the site answered 404 for ${item.path}: no poll resource ${JSON.stringify(item.name)}`
                    + ` there. Is options.prefix (${JSON.stringify(prefix)}) FASTPOLL["PATH_PREFIX"], and`
                    + ` ${JSON.stringify(item.name)} a resource of the site? Nothing is polled now.`);
      setState("refused");
    }

    function wake() {
      if (handle.state === "ended" || handle.state === "refused" || handle.state === "closed") return;
      Object.keys(etags).forEach((name) => { delete etags[name]; });
      go(level, 0);
    }

    // The current transport failed: the next one takes over (after `delay`); the fastest is tried again later.
    function demote(g, delay, lived, to) {
      if (g !== gen) return;
      if (lived >= STREAM_PROVEN_MS) retryDelay = RETRY_MS;
      if (level === 0) {
        retryAt = Date.now() + retryDelay;
        retryDelay = Math.min(retryDelay * 2, MAX_RETRY_MS);
      }
      if (to > level) go(to, delay || 0);
      else if (level < ladder.length - 1) go(level + 1, delay || 0);
      else if (isStream(ladder[level])) askSite(g, null);     // only a fetch reads the site's 401, 403, 404
      else go(level, delay || nextBackoff());
    }

    // One poll of the site: {ended, refused, status, hit, held, changed, took, retryAfter}; throws on errors.
    async function ask(item, wait, g) {
      const headers = {};
      const sent = etags[item.name];
      if (sent) headers["If-None-Match"] = sent;
      if (wait > 0) headers.Prefer = "wait=" + wait;
      const aborter = typeof AbortController === "function" ? new AbortController() : null;
      if (aborter) aborters.add(aborter);
      try {
        return await fetchAnswer(item, sent, headers, aborter, g);
      } finally {
        aborters.delete(aborter);                    // done: not kept for the transport's life
      }
    }

    async function fetchAnswer(item, sent, headers, aborter, g) {
      const began = Date.now();
      let resp;
      try {
        resp = await fetch(item.path, { credentials: "same-origin", cache: "no-store", headers,
                                        signal: aborter ? aborter.signal : undefined });
      } catch (e) {
        if (g === gen) wire({ type: "poll", resource: item.name, status: 0, cache: null, held: false });
        throw e;
      }
      const cache = resp.headers.get("X-Cache");
      const got = { status: resp.status, hit: cache === "HIT",
                    held: resp.headers.has("Preference-Applied"), changed: false, took: Date.now() - began };
      wire({ type: "poll", resource: item.name, status: resp.status, cache: cache, held: got.held });
      if (resp.status === 401 || resp.status === 403) got.ended = true;
      else if (resp.status === 404) got.refused = true;           // the site has no such poll path
      else if (resp.status === 200 || resp.status === 204) {
        const text = resp.status === 200 ? await resp.text() : "";
        got.changed = true;
        if (g === gen) deliver(item.name, resp.headers.get("ETag"), text);
      } else if (resp.status === 429) {
        got.retryAfter = Math.round((parseInt(resp.headers.get("Retry-After"), 10) || 5) * 1000 * (1 + Math.random() / 2));
      } else if (resp.status !== 304 || !sent) throw new Error(`fastpoll: HTTP ${resp.status} from ${item.path}`);
      return got;
    }

    async function pollLoop(item, kind, g) {
      let failures = 0;
      while (g === gen) {
        let next;
        try {
          let wait = kind === "long" ? waitS : 0;
          // below a stream, hold only until the stream is due again (a HIT then brings it back)
          if (wait && level > 0 && isStream(ladder[0])) wait = Math.min(wait, Math.ceil((retryAt - Date.now()) / 1000));
          const got = await ask(item, wait, g);
          if (g !== gen) return;
          if (got.ended) return end();
          if (got.refused) return refused(item);
          failures = 0;
          backoff = POLL_MS;
          if (got.status === 429) {
            // a hold over the cap (other tabs hold the user's share): short polls do not count toward it
            const short = ladder.indexOf("short", level + 1);
            if (kind === "long" && short > level) return demote(g, got.retryAfter, 0, short);
            next = got.retryAfter;
          } else next = kind === "long" && got.held && (got.changed || got.took >= QUICK_MS) ? 0 : POLL_MS;
          if (got.hit && level > 0 && Date.now() >= retryAt) return go(0);
        } catch (e) {
          if (g !== gen) return;                     // aborted: closed, or another transport took over
          next = nextBackoff();
          if (kind === "long" && ++failures >= LONG_FAILURES && level < ladder.length - 1) return demote(g, next);
        }
        await sleep(next);
      }
    }

    // One poll of the site per resource, then the same stream again after `delay` (null: a back-off).
    async function askSite(g, delay) {
      try {
        for (const item of items) {
          const got = await ask(item, 0, g);
          if (g !== gen) return;
          if (got.ended) return end();
          if (got.refused) return refused(item);
        }
      } catch (e) {
        if (g === gen) go(level, nextBackoff());
        return;
      }
      go(level, delay === null ? nextBackoff() : delay);
    }

    // A miss: the site is asked (Django fills the cache), then the same stream again.
    function missed(g) {
      const now = Date.now(), again = now - lastMiss < MISS_AGAIN_MS;
      lastMiss = now;
      askSite(g, again ? POLL_MS : 0);                // misses in a row: slow down
    }

    function openStream(kind, g) {
      let es;
      try {
        es = new EventSource((kind === "edge" ? edge : "") + streamPath, { withCredentials: kind === "edge" });
      } catch (e) {
        return demote(g, 0, 0);
      }
      source = es;
      wire({ type: "open", transport: kind, source: es });
      const created = Date.now();
      let events = 0, openedAt = null, quick = 0;
      items.forEach((item, i) => es.addEventListener(item.name, (ev) => {
        if (g !== gen) return;
        events++;
        wire({ type: "event", transport: kind, resource: item.name });
        backoff = POLL_MS;
        if (kind === "edge") edgeRefused = false;
        // id: every resource's ETag in path order (docs/contract.md section 9), one for one resource
        const ids = items.length > 1 ? ev.lastEventId.split(",") : [ev.lastEventId];
        deliver(item.name, ids[i] || null, ev.data);
      }));
      es.addEventListener("open", () => { openedAt = Date.now(); });
      es.addEventListener("miss", () => {
        if (g !== gen) return;
        es.close();
        wire({ type: "miss", transport: kind });
        missed(g);
      });
      es.addEventListener("error", () => {
        if (g !== gen) return;
        const lived = openedAt === null ? -1 : Date.now() - openedAt;
        openedAt = null;
        quick = lived < STREAM_QUICK_MS ? quick + 1 : 0;
        if (es.readyState !== EventSource.CLOSED && events > 0 && lived >= 0 && quick < STREAM_QUICK_ENDS) return;
        es.close();
        if (kind === "edge" && !edgeRefused) {
          edgeRefused = true;
          wire({ type: "miss", transport: kind });
          missed(g);
        } else demote(g, 0, Date.now() - created);
      });
      if (level > 0) after(retryAt - Date.now(), g, () => go(0));
    }

    go(0, 0);
    return handle;
  }

  window.fastpoll = { subscribe: subscribe };
})();
