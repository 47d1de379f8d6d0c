"""The cluster's hosts and their configuration, in one place: the harness, the drills and
docs/deploy.md read these values and no others.

Every host gets the same shared PLURK_* variables, plus its own PLURK_ROLES, PLURK_HTTP and
PLURK_VAR_DIR (the namespaces share one filesystem, so each host has var/cluster/<host>).  A host
serves the entries of the shared lists that are its own (plurksite.config.is_local_address).
"""
import dataclasses

SUBNET = "10.77.0"
PREFIXLEN = 24
GATEWAY = f"{SUBNET}.1"             # the bridge's address: the machine itself reaches every host
HTTP_PORT = 80                      # the balancer's plain HTTP: only redirects to https
HTTPS_PORT = 443                    # the balancer's https (plurksite.nginxconf.HTTPS_PORT)
SITE_NAME = "plurk.test"            # the site's name (RFC 6761 .test); its certificate names it and the balancer's address
WEB_PORT = 8080                     # each web host's nginx
EDGE_PORT = 8003                    # each web host's edge (fastpath --edge), reached by the balancer only
EDGE_TLS_PORT = 8443                # the balancer's TLS edge (plurksite.nginxconf.EDGE_TLS_PORT)
MEMCACHED_PORT = 11211
POSTGRES_PORT = 5432
NOTIFY_PORTS = (9100, 9101)         # first and last UDP notice port of a web host (one per worker)
FASTPATH_WORKERS = 2
DATABASE = "plurk"                  # the PostgreSQL role and database
VAR_DIR = "var/cluster"             # under the checkout; one subdirectory per host
SECRET_FILE = f"{VAR_DIR}/secret.key"
CA_DIR = f"{VAR_DIR}/tls"           # the cluster's private CA (ca.crt, ca.key), made once (cluster.tls)
CA_FILE = f"{CA_DIR}/ca.crt"        # every host trusts it (SSL_CERT_FILE, REQUESTS_CA_BUNDLE)
STACK_ROLES = ("balancer", "web", "memcached", "repair")


@dataclasses.dataclass(frozen=True)
class Host:
    name: str                       # also the network namespace's name
    address: str
    roles: tuple                    # STACK_ROLES (runstack's PLURK_ROLES), "postgres", "client"
    env: dict                       # this host's PLURK_* variables (shared ones included)

    @property
    def stack_roles(self):
        """The roles ``manage.py runstack`` starts here (PLURK_ROLES); empty: no runstack."""
        return tuple(r for r in self.roles if r in STACK_ROLES)

    @property
    def var_dir(self):
        return f"{VAR_DIR}/{self.name}"

    def listens(self):
        """What listens where on this host, for people: ["nginx 10.77.0.10:80", ...]."""
        where = []
        for role in self.roles:
            if role == "balancer":
                where.append(f"nginx https {self.address}:{HTTPS_PORT} ({SITE_NAME}), "
                             f"{self.address}:{HTTP_PORT} redirects, the edges over TLS at "
                             f"{self.address}:{EDGE_TLS_PORT}")
            elif role == "web":
                where.append(f"nginx {self.address}:{WEB_PORT}, edge {self.address}:{EDGE_PORT}, notices "
                             f"udp:{self.address}:{NOTIFY_PORTS[0]}-{NOTIFY_PORTS[1]} (fastpath, gunicorn on loopback)")
            elif role == "memcached":
                where.append(f"memcached {self.address}:{MEMCACHED_PORT}")
            elif role == "repair":
                where.append("repaircache (once for the cluster)")
            elif role == "postgres":
                where.append(f"postgresql {self.address}:{POSTGRES_PORT}")
            elif role == "client":
                where.append(f"locust against {site_url()}/")
        return where


WEB_HOSTS = 2                        # the default cluster; bench/cluster.py also runs 1


def _addresses(web_hosts=WEB_HOSTS):
    """name -> (last octet, roles)."""
    if not 1 <= web_hosts <= 9:
        raise ValueError(f"web_hosts={web_hosts}: the cluster has room for 1 to 9 web hosts")
    table = {"plk-lb": (10, ("balancer",))}
    table.update({f"plk-web{i}": (20 + i, ("web",)) for i in range(1, web_hosts + 1)})
    table.update({
        "plk-mc1": (31, ("memcached",)),
        "plk-mc2": (32, ("memcached",)),
        "plk-mc3": (33, ("memcached",)),
        "plk-db": (40, ("postgres", "repair")),     # the repairer runs once, beside the truth
        "plk-client": (50, ("client",)),
    })
    return table


def balancer_address():
    return f"{SUBNET}.{_addresses()['plk-lb'][0]}"


def site_url():
    """The site's base URL: https at the balancer's address (its certificate names it)."""
    return f"https://{balancer_address()}"


def edge_url():
    """Where pages reach the edges: the balancer's TLS edge (the site's certificate names it)."""
    return f"https://{balancer_address()}:{EDGE_TLS_PORT}"


def site_origins():
    """The origins the site's pages are opened at (by address and by name): the edges' CORS."""
    return [site_url(), f"https://{SITE_NAME}"]


def site_names():
    """What the balancer's certificate names (subjectAltName entries)."""
    return [f"IP:{balancer_address()}", f"DNS:{SITE_NAME}"]


def _with_role(role, web_hosts=WEB_HOSTS):
    return [f"{SUBNET}.{octet}" for octet, roles in _addresses(web_hosts).values() if role in roles]


def shared_env(web_hosts=WEB_HOSTS):
    """The PLURK_* variables every host of the cluster gets (c-common.md's table)."""
    webs = _with_role("web", web_hosts)
    return {
        "PLURK_MEMCACHED": ",".join(f"{a}:{MEMCACHED_PORT}" for a in _with_role("memcached")),
        "PLURK_DATABASE_URL": f"postgres://{DATABASE}@{_with_role('postgres')[0]}:{POSTGRES_PORT}/{DATABASE}",
        "PLURK_FASTPATH_NOTIFY": ",".join(f"udp:{a}:{NOTIFY_PORTS[0]}-{NOTIFY_PORTS[1]}" for a in webs),
        "PLURK_WEB_HOSTS": ",".join(f"{a}:{WEB_PORT}" for a in webs),
        # the names clients reach the site by: the balancer's address and the site's name
        # (Django's ALLOWED_HOSTS)
        "PLURK_PUBLIC_HOSTS": f"{balancer_address()},{SITE_NAME}",
        "PLURK_SECRET_FILE": SECRET_FILE,
        "PLURK_FASTPATH_WORKERS": str(FASTPATH_WORKERS),
        # every host shares this machine's 2 cores: a process can wait 50 ms (the single-host
        # default) for a CPU alone, and a writer's timed-out store marks a healthy memcached
        # suspect and flushes it (bench/load.py's 10k preset found the same)
        "PLURK_MEMCACHED_TIMEOUT_MS": "500",
        # the edge: each web host's (PLURK_EDGE, its own below; empty elsewhere), reached only by
        # the balancer, which terminates TLS for it (PLURK_WEB_EDGES); pages reach it there.
        # Every edge connection comes from the balancer's address: no per-address cap, the
        # per-user cap (PLURK_MAX_HELD_PER_USER) bounds a client (docs/deploy.md "The edge over TLS")
        "PLURK_EDGE": "",
        "PLURK_EDGE_URL": edge_url(),
        "PLURK_EDGE_ORIGINS": ",".join(site_origins()),
        "PLURK_EDGE_MAX_PER_ADDRESS": "0",
        # the web hosts believe the balancer's X-Forwarded-For/-Proto and X-Request-ID (and no
        # one else's): their logs and per-address caps see the client, not the balancer
        "PLURK_TRUSTED_PROXIES": balancer_address(),
        # the site is https at the balancer: Django's session and CSRF cookies are Secure
        # (docs/deploy.md section 10, step 6); a web host refuses it without the line above
        "PLURK_HTTPS": "1",
        # no cap on held connections per client address: plk-client alone stands for the drills'
        # 2,000 users (at the default 256 the first make drill over TLS got 12,721 429s from
        # the web hosts' nginx; 0 stale, 0 lost, but 10,711 of 27,626 requests failed)
        "PLURK_HELD_PER_ADDRESS": "0",
    }


def hosts(web_hosts=WEB_HOSTS):
    """Every host, in the order the harness starts them (what others need comes first)."""
    shared = shared_env(web_hosts)
    table = _addresses(web_hosts)
    order = ("plk-db", "plk-mc1", "plk-mc2", "plk-mc3",
             *(f"plk-web{i}" for i in range(1, web_hosts + 1)), "plk-lb", "plk-client")
    result = []
    for name in order:
        octet, roles = table[name]
        address = f"{SUBNET}.{octet}"
        env = dict(shared, PLURK_VAR_DIR=f"{VAR_DIR}/{name}")
        entry = Host(name, address, roles, env)
        if entry.stack_roles:
            env["PLURK_ROLES"] = ",".join(entry.stack_roles)
        if "web" in roles:
            env["PLURK_HTTP"] = f"{address}:{WEB_PORT}"
            env["PLURK_EDGE"] = f"{address}:{EDGE_PORT}"
        else:                       # the balancer's, and where the client (locust) sends
            env["PLURK_HTTP"] = f"{balancer_address()}:{HTTP_PORT}"
        if "balancer" in roles:
            env["PLURK_WEB_EDGES"] = ",".join(f"{a}:{EDGE_PORT}" for a in _with_role("web", web_hosts))
        result.append(entry)
    return result


def host(name):
    for entry in hosts():
        if entry.name == name:
            return entry
    raise KeyError(f"no host {name!r}; the cluster has {', '.join(h.name for h in hosts())}")
