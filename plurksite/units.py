"""systemd units for this host's services (``manage.py renderunits``; docs/deploy.md).

One unit per :func:`plurksite.services.commands` entry, whose ExecStart is that entry's argv,
quoted for systemd: what ``manage.py runstack`` runs and what systemd runs are the same command
lines (tests/plurksite/test_units.py compares them for every role).  Beside them: the environment
file every unit reads (the PLURK_* of ``config.to_env()`` and DJANGO_SETTINGS_MODULE), the
``plurk-fastpath.socket`` that owns fastpath's listening socket across restarts (socket
activation: held long-polls are answered 304 on SIGTERM and their re-polls wait in the backlog
for the next fastpath), and ``plurk.target``, which groups them.
"""
import collections
import os
import re
import sys
from urllib.parse import urlsplit

from . import services
from .config import ROOT, ConfigError, format_hostport, is_local_address

ENV_FILE = "/etc/plurk/plurk.env"
TARGET = "plurk.target"
SOCKET = "plurk-fastpath.socket"
RUNTIME_DIR = "plurk"                  # /run/plurk: sockets; kept across restarts (Preserve=yes)
FASTPATH_DRAIN_DEFAULT_S = 5           # fastpath's --drain-timeout when the runner passes none
STOP_MARGIN_S = 5                      # beyond a service's own graceful stop, before SIGKILL

# The service name of services.commands() -> its unit's name, description and settings.
# nofile: LimitNOFILE (None: systemd's default); stop: TimeoutStopSec (None: see _stop_timeout).
Profile = collections.namedtuple("Profile", "unit description nofile stop reload")
_PROFILES = {
    "gunicorn": Profile("plurk-gunicorn", "plurk Django (gunicorn)", None, None, "hup"),
    "repaircache": Profile("plurk-repaircache", "plurk cache repairer (manage.py repaircache)", None, 15, None),
    "fastpath": Profile("plurk-fastpath", "plurk fastpath (polls from memcached)", 20000, None, None),
    # a host runs one nginx: a web host's, or the balancer's
    "nginx": Profile("plurk-nginx", "plurk nginx (web host)", 20000, 15, "nginx"),
    "balancer": Profile("plurk-nginx", "plurk nginx (balancer)", 20000, 15, "nginx"),
}
# memcached -c 4096 (services.memcached_command): its connections plus room
_MEMCACHED = Profile(None, "plurk memcached", 8192, 15, None)

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_SAFE_VALUE = re.compile(r"[A-Za-z0-9_@+=:,./%-]*")


def quote_word(word):
    """One argv word as systemd's ExecStart= reads it back (systemd.service(5), "Command lines"):
    bare when harmless, else in double quotes with \\ and " escaped; % (specifiers) and $
    (variable expansion) doubled either way."""
    if any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in word):
        raise ConfigError(f"cannot write {word!r} in a systemd unit: control characters in a command line")
    if _SAFE_WORD.fullmatch(word):
        return word
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def command_line(argv):
    return " ".join(quote_word(word) for word in argv)


def env_line(name, value):
    """``NAME=value`` for an EnvironmentFile= (and for ``set -a; . file`` in a shell): in single
    quotes, which both read verbatim, unless plain characters only."""
    if "'" in value or "\n" in value:
        raise ConfigError(f"{name}={value!r}: the environment file cannot hold a single quote or a newline; "
                          f"choose a value without them (in PLURK_DATABASE_URL, percent-encode them: %27)")
    return f"{name}={value}" if _SAFE_VALUE.fullmatch(value) else f"{name}='{value}'"


def environment(config, settings_module="plurksite.settings"):
    """The environment every unit runs with: this configuration's PLURK_* and the settings."""
    env = dict(config.to_env())
    env["DJANGO_SETTINGS_MODULE"] = settings_module
    return env


def render_env_file(config, settings_module="plurksite.settings"):
    lines = ["# plurk: the environment of every plurk unit on this host (manage.py renderunits).",
             "# Every host of a cluster has the same values but PLURK_ROLES, PLURK_HTTP and PLURK_VAR_DIR.",
             "# Also for a shell: set -a; . THIS_FILE; set +a"]
    lines += [env_line(name, value) for name, value in environment(config, settings_module).items()]
    return "\n".join(lines) + "\n"


def _profile(cmd):
    if cmd.role == "memcached":
        return _MEMCACHED._replace(unit=f"plurk-{cmd.log}",
                                   description=f"plurk memcached {format_hostport(*cmd.ready)}")
    return _PROFILES[cmd.name]


def _drain_timeout(argv):
    if "--drain-timeout" in argv:
        return int(argv[argv.index("--drain-timeout") + 1])
    return FASTPATH_DRAIN_DEFAULT_S


def _stop_timeout(cmd, profile):
    """TimeoutStopSec: the service's own graceful stop, then a margin; SIGKILL after."""
    if cmd.name == "fastpath":
        # the supervisor kills a worker still draining --drain-timeout + 5 s after SIGTERM
        return _drain_timeout(cmd.argv) + 5 + STOP_MARGIN_S
    if cmd.name == "gunicorn":
        return int(cmd.argv[cmd.argv.index("--graceful-timeout") + 1]) + STOP_MARGIN_S
    return profile.stop


def _database_is_local(config):
    parts = urlsplit(config.database_url)
    if parts.scheme not in ("postgres", "postgresql"):
        return False
    host = parts.hostname or "localhost"
    return host in ("localhost",) or host.startswith("/") or is_local_address(host)


def _manage(*args):
    return [sys.executable, os.path.join(ROOT, "manage.py"), *args]


class Unit:
    """One unit file: its name and [section] -> [(key, value)] in order."""

    def __init__(self, name):
        self.name = name
        self.sections = collections.OrderedDict()

    def set(self, section, key, value):
        self.sections.setdefault(section, []).append((key, value))
        return self

    def values(self, section, key):
        return [v for k, v in self.sections.get(section, []) if k == key]

    def text(self, comment):
        lines = [f"# {line}" for line in comment]
        for section, items in self.sections.items():
            lines += ["", f"[{section}]"] + [f"{k}={v}" for k, v in items]
        return "\n".join(lines) + "\n"


def _common_service(unit, description, user, group, env_file, after, wants):
    unit.set("Unit", "Description", description)
    unit.set("Unit", "Documentation", f"file:{os.path.join(ROOT, 'docs', 'deploy.md')}")
    unit.set("Unit", "PartOf", TARGET)
    unit.set("Unit", "After", " ".join(["network-online.target", *after]))
    unit.set("Unit", "Wants", " ".join(["network-online.target", *wants]))
    unit.set("Service", "Type", "simple")
    unit.set("Service", "User", user)
    unit.set("Service", "Group", group)
    unit.set("Service", "EnvironmentFile", env_file)
    unit.set("Service", "Environment", "PYTHONUNBUFFERED=1")
    unit.set("Service", "WorkingDirectory", ROOT)          # the runner's cwd too
    # /run/plurk holds fastpath's socket (and notice sockets if PLURK_FASTPATH_NOTIFY points
    # there): shared by every unit, kept when one stops.  PrivateTmp stays off (systemd's
    # default), so a socket under /tmp is the same file for nginx, fastpath and Django.
    unit.set("Service", "RuntimeDirectory", RUNTIME_DIR)
    unit.set("Service", "RuntimeDirectoryMode", "0755")
    unit.set("Service", "RuntimeDirectoryPreserve", "yes")
    return unit


def _nginx_ports(config):
    """Every port this host's nginx may bind: PLURK_HTTP's, and on a balancer https's (443) and
    the TLS edge's (8443, with PLURK_WEB_EDGES) too, bound as soon as a certificate is in its var
    dir (a reload renders the config again; the unit is not rendered again)."""
    from . import nginxconf

    ports = [config.http[1]]
    if config.runs("balancer"):
        ports.append(nginxconf.HTTPS_PORT)
        if config.web_edges:
            ports.append(nginxconf.EDGE_TLS_PORT)
    return ports


def _service_unit(config, cmd, *, user, group, env_file, local_after, db_local):
    profile = _profile(cmd)
    unit = Unit(f"{profile.unit}.service")
    after, wants = [], []
    if cmd.name in ("gunicorn", "repaircache", "fastpath"):
        after += local_after                  # this host's memcached first, when it runs one
    if cmd.name in ("gunicorn", "repaircache") and db_local:
        after.append("postgresql.service")
        wants.append("postgresql.service")
    if cmd.name == "fastpath":
        after.append(SOCKET)
    if cmd.name == "nginx":
        after += [SOCKET, "plurk-gunicorn.service"]
    _common_service(unit, profile.description, user, group, env_file, after, wants)
    if cmd.name == "fastpath":
        unit.set("Unit", "Requires", SOCKET)
    if profile.reload == "nginx":
        # render <var_dir>/nginx.conf as the runner does, refused with nginx's own line if
        # `nginx -t` rejects it; a reload re-renders, checks, then signals the master
        unit.set("Service", "ExecStartPre", command_line(_manage("rendernginx")))
    unit.set("Service", "ExecStart", command_line(cmd.argv))
    if profile.reload == "nginx":
        unit.set("Service", "ExecReload", command_line(_manage("rendernginx")))
        unit.set("Service", "ExecReload", "/bin/kill -HUP $MAINPID")
    elif profile.reload == "hup":
        unit.set("Service", "ExecReload", "/bin/kill -HUP $MAINPID")     # gunicorn: new workers, graceful
    # SIGTERM to the main process, which stops its own workers gracefully (fastpath: held polls
    # answered, in-flight requests drained); whatever is left of the group is killed after
    # TimeoutStopSec, as the runner does.
    unit.set("Service", "KillMode", "mixed")
    unit.set("Service", "KillSignal", "SIGTERM")
    unit.set("Service", "TimeoutStopSec", f"{_stop_timeout(cmd, profile)}s")
    unit.set("Service", "Restart", "on-failure")
    unit.set("Service", "RestartSec", "1s")
    if profile.nofile:
        unit.set("Service", "LimitNOFILE", str(profile.nofile))
    if cmd.name in ("nginx", "balancer") and min(_nginx_ports(config)) < 1024:
        unit.set("Service", "AmbientCapabilities", "CAP_NET_BIND_SERVICE")   # port 80, 443 as a user
    unit.set("Install", "WantedBy", TARGET)
    return unit


def _socket_unit(config, *, user, group):
    """fastpath's listening socket, owned by systemd: it stays open while fastpath restarts, and
    connections made meanwhile wait in its backlog (fastpath takes it through LISTEN_FDS and
    checks it is the --listen address)."""
    from fastpath.activation import BACKLOG

    host, port = config.fastpath
    unit = Unit(SOCKET)
    unit.set("Unit", "Description", "plurk fastpath's listening socket (kept across fastpath restarts)")
    unit.set("Unit", "Documentation", f"file:{os.path.join(ROOT, 'docs', 'deploy.md')}")
    unit.set("Unit", "PartOf", TARGET)
    unit.set("Socket", "ListenStream", port if host == "unix" else format_hostport(host, port))
    if host == "unix":
        unit.set("Socket", "SocketUser", user)
        unit.set("Socket", "SocketGroup", group)
        unit.set("Socket", "SocketMode", "0666")        # as fastpath makes it: nginx's workers connect
        unit.set("Socket", "DirectoryMode", "0755")     # nginx's workers search down to it
    unit.set("Socket", "Backlog", str(BACKLOG))         # fastpath's own (capped by net.core.somaxconn)
    unit.set("Socket", "Service", "plurk-fastpath.service")
    unit.set("Install", "WantedBy", TARGET)
    return unit


def render(config, *, user="plurk", group=None, env_file=ENV_FILE, settings_module="plurksite.settings",
           poll_resources=None, external_nginx=False):
    """This host's units: [(file name, text)], the environment file last (``plurk.env``).

    ``external_nginx``: the operator's nginx serves the http-level include instead of
    plurk-nginx.service (``manage.py rendernginx --include``)."""
    group = group or user
    cmds = services.commands(config, settings_module, poll_resources)
    if external_nginx:
        cmds = [c for c in cmds if c.name not in ("nginx", "balancer")]
    local_after = [f"{_profile(c).unit}.service" for c in cmds if c.role == "memcached"]
    db_local = _database_is_local(config)
    units = []
    for cmd in cmds:
        units.append(_service_unit(config, cmd, user=user, group=group, env_file=env_file,
                                   local_after=local_after, db_local=db_local))
        if cmd.name == "fastpath":
            units.append(_socket_unit(config, user=user, group=group))
    names = [u.name for u in units]
    if len(set(names)) != len(names):
        raise ConfigError(f"two services of this host would have one unit name ({', '.join(names)}); give each "
                          f"local PLURK_MEMCACHED entry its own port")
    target = Unit(TARGET)
    target.set("Unit", "Description", f"plurk: this host's services (PLURK_ROLES={','.join(config.roles)})")
    target.set("Unit", "Documentation", f"file:{os.path.join(ROOT, 'docs', 'deploy.md')}")
    target.set("Unit", "Wants", " ".join(names))
    target.set("Unit", "After", "network-online.target")
    target.set("Install", "WantedBy", "multi-user.target")
    header = ["Rendered by `manage.py renderunits` from this host's PLURK_* variables: render again after",
              "changing them, never edit.  ExecStart is the command line `manage.py runstack` runs."]
    files = [(u.name, u.text(header)) for u in units + [target]]
    files.append(("plurk.env", render_env_file(config, settings_module)))
    return files


def exec_starts(files):
    """{unit name: its ExecStart= value} of render()'s output (for tests and the guide)."""
    found = {}
    for name, text in files:
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                found[name] = line[len("ExecStart="):]
    return found
