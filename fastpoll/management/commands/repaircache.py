import signal
import time

from django.db import close_old_connections

from fastpoll import conf, repair
from fastpoll.management.base import StoreCommand, positive_seconds
from fastpoll.management.commands.warmcache import warm as warm_answers


class Command(StoreCommand):
    help = ("Pay the cache's debts: flush every suspect memcached server that answers again, "
            "rewrite stale keys, and write the answers of changes whose writer died (the outbox).  "
            "Exit status 2 when a server did not answer (its debts wait).  "
            "--loop keeps doing it (the stack runner's repaircache service).")

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="repeat until SIGTERM/SIGINT")
        parser.add_argument("--warm", action="store_true",
                            help="first write the answers of recently active users (manage.py warmcache)")
        parser.add_argument("--interval", type=positive_seconds, default=None,
                            help="seconds between passes (default FASTPOLL['REPAIR_INTERVAL'])")

    def handle(self, *args, loop=False, interval=None, warm=False, **options):
        interval = interval if interval is not None else conf.get_config()["REPAIR_INTERVAL"]
        if interval <= 0:
            interval = 0.5
        if warm:
            # a memcached the stack has just started is empty: fill it before the polls come
            try:
                self._report(repair.repair())   # flush returning servers first, then fill
                count, failed = warm_answers()
            except Exception as exc:
                self.stderr.write(f"repaircache: warming failed: {exc}")
            else:
                self.stdout.write(f"warmed the answers of {count} recently active user(s)"
                                  + (f", {len(failed)} not written" if failed else ""))
        if not loop:
            report = repair.repair()
            self._report(report)
            if report["unreachable"]:
                raise SystemExit(2)      # as checkcache: what such a server owes is still owed
            return
        stop = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *a: stop.append(True))
        self.stdout.write(f"repaircache: checking every {interval:g}s", ending="\n")
        self.stdout.flush()
        while not stop:
            close_old_connections()
            try:
                report = repair.repair()
            except Exception as exc:       # a database hiccup must not kill the service
                self.stderr.write(f"repaircache: pass failed: {exc}")
            else:
                if report["flushed"] or report["rewritten"] or report["still_stale"] or report["replayed"]:
                    self._report(report)
            deadline = time.monotonic() + interval
            while not stop and time.monotonic() < deadline:
                time.sleep(min(0.1, interval))

    def _report(self, report):
        for node in report["flushed"]:
            self.stdout.write(f"flushed {node} (it was suspect and answers again)")
        for node in report["unreachable"]:
            self.stdout.write(f"still unreachable: {node}")
        if report["rewritten"] or report["still_stale"]:
            self.stdout.write(f"rewrote {report['rewritten']} stale key(s), {report['still_stale']} left")
        if report["replayed"]:
            self.stdout.write(f"wrote the answers of {report['replayed']} change(s) whose writer "
                              "did not finish (outbox)")
        self.stdout.flush()
