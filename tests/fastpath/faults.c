/* LD_PRELOAD shim for tests/fastpath/test_failures.py: makes chosen libevent, libc and libcrypto
 * calls fail inside a running fastpath, so that its handling of failures a healthy machine
 * never shows (a timer libevent cannot schedule, a listener it cannot re-enable...) is run.
 *
 * A fault is armed by a file in $FP_FAULT_DIR: "<name>" fails every matching call while it
 * exists, "<name>.once" fails the next matching call only (the file is removed when it fires).
 * A file that holds a pid arms the fault in that process only.
 *
 *   accept            accept4() fails with EMFILE (libevent's listener then calls its error cb)
 *   listener_enable   evconnlistener_enable() fails
 *   pause_timer       event_add() of a timer of exactly 100 ms (fastpath's accept pause)
 *   mc_timer          event_add() of any other timer (memcached deadlines)
 *   sha256            SHA256_Update() fails
 *   wall_clock        event_base_gettimeofday_cached() fails
 *
 * Built by the test (cc -shared); not part of fastpath.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/sha.h>

/* The file exists and is empty or names this process. */
static int applies(const char *path)
{
    char text[32];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n <= 0)
        return n == 0;
    text[n] = '\0';
    return atol(text) == (long)getpid();
}

static int armed(const char *name)
{
    const char *dir = getenv("FP_FAULT_DIR");
    char path[4096];
    if (dir == NULL)
        return 0;
    snprintf(path, sizeof(path), "%s/%s.once", dir, name);
    if (applies(path) && unlink(path) == 0)
        return 1;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return applies(path);
}

static void *real(const char *name)
{
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL) {
        fprintf(stderr, "faults.so: no %s\n", name);
        abort();
    }
    return fn;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    static int (*next)(int, struct sockaddr *, socklen_t *, int);
    if (armed("accept")) {
        errno = EMFILE;
        return -1;
    }
    if (next == NULL)
        next = real("accept4");
    return next(fd, addr, len, flags);
}

int evconnlistener_enable(struct evconnlistener *l)
{
    static int (*next)(struct evconnlistener *);
    if (armed("listener_enable")) {
        errno = ENOMEM;
        return -1;
    }
    if (next == NULL)
        next = real("evconnlistener_enable");
    return next(l);
}

int event_add(struct event *ev, const struct timeval *tv)
{
    static int (*next)(struct event *, const struct timeval *);
    if (tv != NULL && event_get_fd(ev) == -1) {
        int pause = tv->tv_sec == 0 && tv->tv_usec == 100000;
        if (armed(pause ? "pause_timer" : "mc_timer")) {
            errno = ENOMEM;
            return -1;
        }
    }
    if (next == NULL)
        next = real("event_add");
    return next(ev, tv);
}

int SHA256_Update(SHA256_CTX *c, const void *data, size_t len)
{
    static int (*next)(SHA256_CTX *, const void *, size_t);
    if (armed("sha256"))
        return 0;
    if (next == NULL)
        next = real("SHA256_Update");
    return next(c, data, len);
}

int event_base_gettimeofday_cached(struct event_base *base, struct timeval *tv)
{
    static int (*next)(struct event_base *, struct timeval *);
    if (armed("wall_clock"))
        return -1;
    if (next == NULL)
        next = real("event_base_gettimeofday_cached");
    return next(base, tv);
}
