"""``manage.py drill``: bring the namespace cluster up, run the failure drills under a locust
load of long-polling users, print one verdict line per drill and a line of totals, tear the
cluster down.  Exit status 1 when any drill lost a message or left a stale answer."""
import json
import logging
import os
import sys

from django.core.management.base import BaseCommand, CommandError

from plurksite.cluster import ClusterError


class Command(BaseCommand):
    help = ("Run the failure drills of issue 16 against the namespace cluster (plurksite.cluster): "
            "each fault under a locust load of long-polling users, judged on stale answers and lost "
            "messages (must be 0), with failed requests and delivery latency during and after.  Needs root.")

    def add_arguments(self, parser):
        from plurksite.cluster.drills import DRILLS

        parser.add_argument("--short", action="store_true",
                            help="only the short run of `make test` (a memcached partition, a web host killed)")
        parser.add_argument("--only", nargs="+", metavar="DRILL", choices=[d.name for d in DRILLS],
                            help="run these drills, in this order")
        parser.add_argument("--users", type=int, default=2000, help="long-polling locust users (default 2000)")
        parser.add_argument("--processes", type=int, default=2, help="locust worker processes (default 2)")
        parser.add_argument("--poll-wait", type=float, default=None,
                            help="mean seconds between a user's actions (PLURK_LOAD_POLL_WAIT)")
        parser.add_argument("--db-delay-ms", type=int, default=1,
                            help="delay the database host's link this much each way, as a database on "
                                 "another machine is (default 1; 0: none)")
        parser.add_argument("--json", metavar="PATH", help="also write the report as JSON here")

    def _say(self, text):
        self.stdout.write(text)
        self.stdout.flush()

    def handle(self, *args, **options):
        from plurksite.cluster import drills
        from plurksite.cluster.harness import Cluster

        if options["users"] < 1:
            raise CommandError("--users must be at least 1")
        if options["db_delay_ms"] < 0:
            raise CommandError("--db-delay-ms must be 0 or more")
        chosen = drills.select(options["only"] or (drills.SHORT if options["short"] else
                                                   [d.name for d in drills.DRILLS]))
        logging.getLogger("plurksite.cluster").addHandler(logging.StreamHandler(sys.stderr))
        self._say(f"Bringing the cluster up for {len(chosen)} drill(s)...")
        try:
            with Cluster(say=lambda text: self._say(f"  {text}")) as cluster:
                report = drills.run_drills(cluster, chosen, users=options["users"],
                                           processes=options["processes"], poll_wait=options["poll_wait"],
                                           db_delay_ms=options["db_delay_ms"], say=self._say)
        except KeyboardInterrupt:
            raise CommandError("interrupted; the cluster is removed") from None
        except ClusterError as exc:
            raise CommandError(str(exc)) from None
        for result in report["drills"]:
            self._say(drills.verdict_line(result))
        for problem in report["problems"]:
            self._say(f"problem: {problem}")
        self._say(drills.totals_line(report))
        if options["json"]:
            os.makedirs(os.path.dirname(os.path.abspath(options["json"])), exist_ok=True)
            with open(options["json"], "w") as fh:
                json.dump(report, fh, indent=1)
                fh.write("\n")
        if not report["passed"]:
            self._say(f"locust's CSVs and records: {report['work_dir']}")
            raise SystemExit(1)
