"""``python -m fastpath``: the command-line interface (exit 2: bad usage, 1: cannot run)."""
import argparse
import sys

from .errors import ConfigurationError, FastpathError
from ._lifecycle import DEFAULT_RESOURCES, Options, serve


def _csv(text):
    return tuple(part.strip() for part in text.split(",") if part.strip())


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m fastpath",
        description="Answer /Poll/<resource> requests straight from memcached; 404 on a miss so "
                    "that nginx falls back to Django.")
    p.add_argument("--listen", default="127.0.0.1:8001", help="host:port to serve polls on, or unix:/path (nginx on this host)")
    p.add_argument("--admin", default=None, help="loopback host:port serving /metrics (Prometheus)")
    p.add_argument("--memcached", type=_csv, default=("127.0.0.1:11211",),
                   help="comma-separated memcached host:port list (mapped as pymemcache's HashClient)")
    p.add_argument("--secret-file", default="var/secret.key", help="the HMAC secret shared with Django")
    p.add_argument("--workers", type=int, default=1, help="worker processes (0: one per CPU)")
    p.add_argument("--timeout-ms", type=int, default=50, help="memcached answer deadline (503 after)")
    p.add_argument("--idle-timeout", type=int, default=10,
                   help="seconds a request may take to arrive, a response to be read, or a "
                        "keep-alive connection to stay idle")
    p.add_argument("--drain-timeout", type=int, default=5, help="seconds SIGTERM waits for in-flight requests")
    p.add_argument("--max-body", type=int, default=65536, help="largest request body (413 beyond)")
    p.add_argument("--max-headers", type=int, default=8192, help="largest request head")
    p.add_argument("--max-connections", type=int, default=16384,
                   help="open connections per worker; more are closed at once so nginx falls back")
    p.add_argument("--resources", type=_csv, default=DEFAULT_RESOURCES,
                   help="poll resources served (others: 404, so Django answers)")
    p.add_argument("--backend", choices=("epoll", "poll", "select"), default=None,
                   help="libevent backend (default: libevent's best)")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    opts = Options(listen=args.listen, admin=args.admin, memcached=args.memcached,
                   secret_file=args.secret_file, workers=args.workers, timeout_ms=args.timeout_ms,
                   idle_timeout=args.idle_timeout, drain_timeout=args.drain_timeout,
                   max_body=args.max_body, max_headers=args.max_headers,
                   max_connections=args.max_connections,
                   resources=args.resources, backend=args.backend)
    try:
        serve(opts)
    except ConfigurationError as exc:
        parser.error(str(exc))
    except FastpathError as exc:
        print(f"fastpath: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
