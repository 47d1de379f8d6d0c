"""``manage.py runcluster``: the multi-host site on this machine, one network namespace per host
(plurksite.cluster), in the foreground until Ctrl-C or SIGTERM, which remove all of it."""
import logging
import signal
import sys

from django.core.management.base import BaseCommand, CommandError

from plurksite.cluster import ClusterError, topology


class Command(BaseCommand):
    help = ("Build the cluster of issue 16 in network namespaces (balancer, 2 web hosts, 3 memcached hosts, "
            "PostgreSQL, a client host), run each host's services in its namespace, and remove everything "
            "on Ctrl-C or SIGTERM.  Needs root.")

    def add_arguments(self, parser):
        parser.add_argument("--no-demo", action="store_true", help="do not load the demo users")

    def _say(self, text):
        self.stdout.write(f"  {text}")
        self.stdout.flush()

    def _summary(self, cluster):
        lines = ["", "The cluster is up:"]
        for host in cluster.hosts:
            roles = ",".join(host.roles)
            lines.append(f"  {host.name:<11} {host.address:<11} {roles:<17} {'; '.join(host.listens())}")
        lines += [f"  open {topology.site_url()}/ from this machine (the bridge "
                  f"{topology.GATEWAY} reaches every host); demo logins alice, bob, carol, dave "
                  f"(password plurkdemo1)" if cluster.seed_demo else
                  f"  open {topology.site_url()}/ from this machine",
                  f"  the site's certificate is signed by the cluster's CA, {cluster.ca_file}: "
                  f"curl --cacert {topology.CA_FILE} {topology.site_url()}/ (or --resolve "
                  f"{topology.SITE_NAME}:{topology.HTTPS_PORT}:{topology.balancer_address()} "
                  f"https://{topology.SITE_NAME}/); a browser needs it imported",
                  f"  run a command on a host: ip netns exec plk-web1 <command>",
                  f"  logs: {topology.VAR_DIR}/<host>/log/",
                  "Press Ctrl-C to stop (removes every namespace, link and process)."]
        return "\n".join(lines) + "\n"

    def handle(self, *args, **options):
        from plurksite.cluster.harness import Cluster

        logging.getLogger("plurksite.cluster").addHandler(logging.StreamHandler(sys.stderr))
        cluster = Cluster(seed_demo=not options["no_demo"], say=self._say)
        self.stdout.write("Bringing the cluster up...")
        try:
            with cluster:
                self.stdout.write(self._summary(cluster))
                while True:
                    signal.pause()
        except KeyboardInterrupt:
            self.stdout.write("stopped; the cluster is removed.")
        except ClusterError as exc:
            raise CommandError(str(exc)) from None
