/* Notices (fp_notify.h).  The format, strictly:
 *
 *     "PN1 " sender " " seq "\n" *( key "\n" )
 *
 * sender = 16 lowercase hex digits, seq = 1*20 DIGIT without leading zero (>= 1), key = 1..FP_KEY_CAP
 * bytes of %x21-7E; at most FP_NOTIFY_MAX bytes.  Anything else is counted and dropped whole.
 *
 * The sockets are made by each worker, not before fork: a worker the supervisor restarts binds
 * its own path (a stale file of the worker that died is unlinked first) and its own UDP port
 * again, and nothing of them has to cross the fork.  A datagram is the same whichever socket
 * it came in on: the sender table (gaps) is shared, since a sender uses one transport.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fp_notify.h"
#include "fp_util.h"

#define READS_PER_EVENT 64           /* datagrams taken per readable event: others get a turn */
#define RCVBUF_BYTES (1 << 20)       /* a burst of notices waits in the kernel, not dropped */

static int _hex(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* "PN1 <sender> <seq>\n": the length of the line, or 0 if it is not one. */
static size_t _header(const char *d, size_t len, uint64_t *sender, uint64_t *seq)
{
    size_t i = 0;
    if (len < 4 + 16 + 1 + 1 + 1 || memcmp(d, "PN1 ", 4) != 0)
        return 0;
    i = 4;
    *sender = 0;
    for (int k = 0; k < 16; k++, i++) {
        int h = _hex(d[i]);
        if (h < 0)
            return 0;
        *sender = *sender << 4 | (uint64_t)h;
    }
    if (d[i++] != ' ' || i >= len || d[i] < '1' || d[i] > '9')
        return 0;
    *seq = 0;
    for (int digits = 0; i < len && d[i] >= '0' && d[i] <= '9'; i++) {
        uint64_t v = (uint64_t)(d[i] - '0');
        if (++digits > 20 || *seq > (UINT64_MAX - v) / 10)
            return 0;
        *seq = *seq * 10 + v;
    }
    if (i >= len || d[i] != '\n')
        return 0;
    return i + 1;
}

/* Every key line well-formed (checked before any is acted on). */
static int _keys_valid(const char *d, size_t len)
{
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        if (d[i] == '\n') {
            if (i == start || i - start > FP_KEY_CAP)
                return 0;
            start = i + 1;
        } else if ((unsigned char)d[i] < 0x21 || (unsigned char)d[i] > 0x7e) {
            return 0;
        }
    }
    return start == len;
}

/* The sender's sequence: a known sender that skipped numbers lost notices (a gap); a new one
 * (or one forgotten to make room) is not a gap. */
static int _gap(fp_notify_t *n, uint64_t sender, uint64_t seq)
{
    int64_t now = fp_now_us();
    int oldest = 0;
    for (int i = 0; i < n->n_senders; i++) {
        fp_notify_sender_t *s = &n->senders[i];
        if (s->id == sender) {
            int gap = seq != s->seq + 1;
            s->seq = seq;
            s->seen_us = now;
            return gap;
        }
        if (s->seen_us < n->senders[oldest].seen_us)
            oldest = i;
    }
    int slot = n->n_senders < FP_NOTIFY_SENDERS ? n->n_senders++ : oldest;
    n->senders[slot] = (fp_notify_sender_t){sender, seq, now};
    return 0;
}

void fp_notify_datagram(fp_notify_t *n, const char *data, size_t len)
{
    uint64_t sender, seq;
    size_t h = len <= FP_NOTIFY_MAX ? _header(data, len, &sender, &seq) : 0;
    if (h == 0 || !_keys_valid(data + h, len - h)) {
        n->st->notices_malformed++;
        return;
    }
    n->st->notices++;
    if (_gap(n, sender, seq)) {
        n->st->notice_gaps++;
        fp_wait_reread_all(n->waits);
    }
    for (size_t start = h, i = h; i < len; i++) {
        if (data[i] == '\n') {
            n->st->notice_keys++;
            (void)fp_wait_notice(n->waits, data + start, i - start);
            start = i + 1;
        }
    }
}

static void _on_readable(evutil_socket_t fd, short what, void *arg)
{
    fp_notify_source_t *src = arg;
    static char buf[FP_NOTIFY_MAX + 1];    /* one worker, one thread: 64 KiB off the stack */
    for (int i = 0; i < READS_PER_EVENT; i++) {
        ssize_t len = recv(fd, buf, sizeof(buf), MSG_TRUNC);
        if (len < 0) {
            /* ECONNREFUSED cannot come to an unconnected socket; logged like any other */
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                fp_log("notice socket %s: recv failed (%s)", src->name, strerror(errno));
            return;
        }
        if (src->udp)
            src->owner->st->notice_udp_datagrams++;
        /* MSG_TRUNC: len is the datagram's real size, so one too large is seen as such */
        fp_notify_datagram(src->owner, buf, (size_t)len <= sizeof(buf) ? (size_t)len : FP_NOTIFY_MAX + 1);
    }
}

static int _fail(char *err, size_t err_len, const char *what, const char *name)
{
    snprintf(err, err_len, "notice socket %s: %s (%s)", name, what, strerror(errno));
    return -1;
}

static void _source_reset(fp_notify_source_t *src, fp_notify_t *owner, int udp)
{
    memset(src, 0, sizeof(*src));
    src->fd = -1;
    src->udp = udp;
    src->owner = owner;
}

/* The bound socket src->fd: a large receive buffer, then read on base. */
static int _watch(fp_notify_source_t *src, struct event_base *base, char *err, size_t err_len)
{
    int rcvbuf = RCVBUF_BYTES;
    if (setsockopt(src->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)) != 0)
        fp_log("notice socket %s: SO_RCVBUF not raised (%s)", src->name, strerror(errno));
    src->ev = event_new(base, src->fd, EV_READ | EV_PERSIST, _on_readable, src);
    if (src->ev == NULL || event_add(src->ev, NULL) < 0)
        return _fail(err, err_len, "cannot watch it", src->name);
    return 0;
}

void fp_notify_init(fp_notify_t *n, fp_wait_table_t *waits, fp_stats_t *st)
{
    memset(n, 0, sizeof(*n));
    _source_reset(&n->unix_src, n, 0);
    _source_reset(&n->udp_src, n, 1);
    n->waits = waits;
    n->st = st;
}

int fp_notify_listen_unix(fp_notify_t *n, struct event_base *base, const char *dir, int index,
                          char *err, size_t err_len)
{
    fp_notify_source_t *src = &n->unix_src;
    struct sockaddr_un sa;

    int plen = snprintf(src->name, sizeof(src->name), "%s/%d.sock", dir, index);
    if (plen < 0 || (size_t)plen >= sizeof(src->name)) {
        snprintf(err, err_len, "--notify-dir %.200s: too long for a unix socket path", dir);
        src->name[0] = '\0';
        return -1;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return _fail(err, err_len, "cannot make its directory", src->name);
    if (unlink(src->name) != 0 && errno != ENOENT)
        return _fail(err, err_len, "cannot remove the stale socket", src->name);
    src->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (src->fd < 0)
        return _fail(err, err_len, "socket failed", src->name);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, src->name, (size_t)plen);
    if (bind(src->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        return _fail(err, err_len, "cannot bind", src->name);
    /* writable by Django whatever its user (bind() gave the umask's mode, and sending needs w):
     * as --listen's unix socket (activation.py), the directory's permissions limit who reaches it */
    if (chmod(src->name, 0666) != 0)
        return _fail(err, err_len, "cannot chmod", src->name);
    struct stat sb;
    if (stat(src->name, &sb) != 0)
        return _fail(err, err_len, "cannot stat it", src->name);
    n->ino = (uint64_t)sb.st_ino;
    return _watch(src, base, err, err_len);
}

int fp_notify_listen_udp(fp_notify_t *n, struct event_base *base, const char *host, int port,
                         char *err, size_t err_len)
{
    fp_notify_source_t *src = &n->udp_src;
    struct sockaddr_storage ss;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    socklen_t ss_len = 0;

    memset(&ss, 0, sizeof(ss));
    if (evutil_inet_pton(AF_INET, host, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        ss_len = sizeof(*sin);
        snprintf(src->name, sizeof(src->name), "udp:%.64s:%d", host, port);
    } else if (evutil_inet_pton(AF_INET6, host, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        ss_len = sizeof(*sin6);
        snprintf(src->name, sizeof(src->name), "udp:[%.64s]:%d", host, port);
    } else {
        snprintf(src->name, sizeof(src->name), "udp:%.64s:%d", host, port);
    }
    if (ss_len == 0 || port <= 0 || port > 65535) {
        snprintf(err, err_len, "notice socket %s: not a numeric address and port", src->name);
        return -1;
    }
    /* no SO_REUSEADDR/SO_REUSEPORT: a second fastpath on the same port must fail, not split
     * the notices between the two */
    src->fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (src->fd < 0)
        return _fail(err, err_len, "socket failed", src->name);
    if (bind(src->fd, (struct sockaddr *)&ss, ss_len) != 0)
        return _fail(err, err_len, "cannot bind", src->name);
    return _watch(src, base, err, err_len);
}

static void _source_close(fp_notify_source_t *src)
{
    if (src->ev != NULL)
        event_free(src->ev);
    src->ev = NULL;
    if (src->fd >= 0)
        close(src->fd);
    src->fd = -1;
}

void fp_notify_fini(fp_notify_t *n)
{
    int had_unix = n->unix_src.fd >= 0;
    _source_close(&n->udp_src);
    _source_close(&n->unix_src);
    if (had_unix) {
        struct stat sb;
        /* only if it is still the file we bound (a new worker may have replaced it); a failure
         * leaves a stale file that the next worker of this index replaces */
        if (n->ino != 0 && stat(n->unix_src.name, &sb) == 0 && (uint64_t)sb.st_ino == n->ino)
            (void)unlink(n->unix_src.name);
    }
}
