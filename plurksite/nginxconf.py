"""Renders nginx/plurk.conf.template into the run-time directory."""
import grp
import os
import re

from .config import ROOT, format_hostport
from .services import FASTPATH_IDLE_TIMEOUT_S, GUNICORN_KEEPALIVE_S

TEMPLATE = os.path.join(ROOT, "nginx", "plurk.conf.template")
_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def _user_directive():
    # Running as root (make run on a fresh machine): workers drop to an unprivileged user.
    if os.geteuid() != 0:
        return "# not root: workers run as the invoking user"
    for group in ("nogroup", "nobody"):
        try:
            grp.getgrnam(group)
            return f"user nobody {group};"
        except KeyError:
            continue
    return "user nobody;"


def context(config, worker_processes="auto"):
    return {
        "user_directive": _user_directive(),
        "worker_processes": str(worker_processes),
        "var_dir": config.var_dir,
        "log_dir": config.log_dir(),
        "http": format_hostport(*config.http),
        "fastpath": format_hostport(*config.fastpath),
        "django": format_hostport(*config.django),
        "max_body": f"{config.max_body_kb}k",
        # below the upstreams' own idle timeouts (see services.py)
        "fastpath_keepalive_timeout": f"{max(1, FASTPATH_IDLE_TIMEOUT_S - 2)}s",
        "django_keepalive_timeout": f"{max(1, GUNICORN_KEEPALIVE_S - 15)}s",
    }


def render_text(template_text, values):
    def substitute(match):
        name = match.group(1)
        if name not in values:
            raise KeyError(f"{TEMPLATE}: unknown placeholder {{{{ {name} }}}}")
        return values[name]

    return _PLACEHOLDER.sub(substitute, template_text)


def render(config, worker_processes="auto"):
    """Write ``<var_dir>/nginx.conf`` and the temp directories; return the file's path."""
    with open(TEMPLATE) as fh:
        text = render_text(fh.read(), context(config, worker_processes))
    for name in TEMP_DIRS:
        os.makedirs(os.path.join(config.var_dir, "nginx", name), exist_ok=True)
    os.makedirs(config.log_dir(), exist_ok=True)
    path = os.path.join(config.var_dir, "nginx.conf")
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path
