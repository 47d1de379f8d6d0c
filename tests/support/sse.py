"""A poll stream (Server-Sent Events) read as a browser's EventSource reads it, for the tests
that reach the stack over https with http.client (or through curl)."""
import time


def open_held_stream(connect, token, within=10, path="/Poll/getUnreadCount"):
    """A stream that fastpath holds, on a connection from ``connect()``: Django's one-event
    answer to a miss is read and the stream asked again with its last id, as EventSource does.
    (conn, response with its first line not read yet, the last id Django gave or None)."""
    deadline = time.monotonic() + within
    last_id = None
    while True:
        conn = connect()
        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        if last_id:
            headers["Last-Event-ID"] = last_id
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
        if resp.getheader("X-Cache") == "HIT":
            return conn, resp, last_id
        text = resp.read().decode()
        conn.close()
        if "id: " in text:
            last_id = text.split("id: ", 1)[1].split("\n", 1)[0]
        assert time.monotonic() < deadline, "fastpath never held the stream"
        time.sleep(1.0)


def read_event(readline):
    """The next event's fields from a stream's ``readline`` (bytes): comments, the heartbeat's,
    and the stream's first line (retry:) skipped; AssertionError when the stream ends first."""
    fields = {}
    while True:
        line = readline()
        assert line, f"the stream ended: {fields}"
        line = line.decode().rstrip("\n")
        if not line:
            if fields:
                return fields
            continue
        if not line.startswith((":", "retry:")):
            name, _, value = line.partition(": ")
            fields[name] = value
