"""The one configuration source: defaults, parsing, and the errors an operator sees."""
import os
import subprocess
import sys

import pytest

from plurksite import services
from plurksite.config import ROOT, VARIABLES, ConfigError, StackConfig, parse_hostport, variables_table


def _in_var_dir_or_run_plurk(path, var_dir):
    """Where the default socket goes: under the var dir, unless root's nginx workers could not
    reach it there (a checkout in a 0700 directory): then /run/plurk/<digest>/."""
    import hashlib

    from plurksite.config import _others_can_search

    if os.geteuid() != 0 or _others_can_search(var_dir):
        return path
    return f"/run/plurk/{hashlib.sha1(os.fsencode(var_dir)).hexdigest()[:12]}/fastpath.sock"


def test_defaults_are_documented_and_valid():
    config = StackConfig.from_env({})
    assert config.http == ("127.0.0.1", 8080)
    assert config.django == ("127.0.0.1", 8000)
    var = os.path.join(ROOT, "var")
    assert config.fastpath == ("unix", _in_var_dir_or_run_plurk(os.path.join(var, "run", "fastpath.sock"), var))
    assert config.memcached == (("127.0.0.1", 11211),)
    assert config.sqlite_path.endswith("var/plurk.sqlite3")
    assert all(var.help for var in VARIABLES)


def test_round_trip_through_environment():
    env = {"PLURK_MEMCACHED": "127.0.0.1:1,[::1]:2", "PLURK_HTTP": "127.0.0.1:9090",
           "PLURK_DATABASE_URL": "postgres://u:p@127.0.0.1:5432/db"}
    config = StackConfig.from_env(env)
    assert StackConfig.from_env(config.to_env()) == config
    assert config.memcached_nodes == ["127.0.0.1:1", "::1:2"]     # as pymemcache names nodes
    assert config.memcached_specs == ["127.0.0.1:1", "[::1]:2"]
    assert config.sqlite_path is None


@pytest.mark.parametrize("value", ["", "host", "host:", ":80", "h:0", "h:65536", "h:abc", "[::1]"])
def test_bad_hostport_names_the_variable(value):
    with pytest.raises(ConfigError, match="PLURK_HTTP"):
        StackConfig.from_env({"PLURK_HTTP": value})


@pytest.mark.parametrize("env, words", [
    ({"PLURK_MEMCACHED": " , "}, "PLURK_MEMCACHED is empty"),
    ({"PLURK_MEMCACHED": "127.0.0.1:1,127.0.0.1:1"}, "twice"),
    ({"PLURK_DATABASE_URL": "mysql://x"}, "PLURK_DATABASE_URL"),
    ({"PLURK_GUNICORN_WORKERS": "zero"}, "PLURK_GUNICORN_WORKERS"),
    ({"PLURK_MEMCACHED_TIMEOUT_MS": "0"}, "1 to 10000"),
    ({"PLURK_DJANGO": "127.0.0.1:8080"}, "both use 127.0.0.1:8080"),
    ({"PLURK_FASTPATH_ADMIN": "0.0.0.0:9"}, "loopback"),
    ({"PLURK_DJANGO": "0.0.0.0:8000"}, "PLURK_DJANGO=.*loopback"),
    ({"PLURK_FASTPATH": "192.0.2.1:8001"}, "PLURK_FASTPATH=.*loopback"),
    ({"PLURK_MAX_BODY_KB": "0"}, "PLURK_MAX_BODY_KB"),
    # misread or a traceback before
    ({"PLURK_DATABASE_URL": "sqlite:foo.db"}, "PLURK_DATABASE_URL=.*sqlite:///"),
    ({"PLURK_DATABASE_URL": "sqlite://"}, "PLURK_DATABASE_URL"),
    ({"PLURK_DATABASE_URL": "postgres://u:p@localhost:99999/db"}, "port must be a number"),
    ({"PLURK_DATABASE_URL": "postgres://u:p@localhost:abc/db"}, "port must be a number"),
    ({"PLURK_DATABASE_URL": "postgres://u:p@localhost:5432/"}, "name the database"),
    ({"PLURK_SECRET_FILE": " "}, "PLURK_SECRET_FILE is empty"),
    ({"PLURK_DEBUG": "2"}, "PLURK_DEBUG='2': expected 1 or 0"),
    ({"PLURK_HTTP": "127.0.0.1:\u00b2"}, "PLURK_HTTP"),
    ({"PLURK_MEMCACHED": "127.0.0.1:\u0661\u0661"}, "PLURK_MEMCACHED"),
    ({"PLURK_FASTPATH_NOTIFY": "udp:127.0.0.1:9100-9\u00b2"}, "PLURK_FASTPATH_NOTIFY: bad entry"),
])
def test_invalid_values_are_refused_with_a_reason(env, words):
    with pytest.raises(ConfigError, match=words):
        StackConfig.from_env(env)


@pytest.mark.parametrize("value, debug", [("1", True), ("True", True), (" on ", True), ("0", False),
                                          ("False", False), ("", False)])
def test_debug_reads_the_usual_spellings(value, debug):
    assert StackConfig.from_env({"PLURK_DEBUG": value}).debug is debug


def test_postgres_without_a_host_is_the_local_socket():
    assert StackConfig.from_env({"PLURK_DATABASE_URL": "postgres:///plurk"}).database_url == "postgres:///plurk"


@pytest.mark.parametrize("env, words", [
    ({"PLURK_SECRET_FILE": "/dev/null"}, "error: PLURK_SECRET_FILE: /dev/null: the secret must be"),
    ({"PLURK_SECRET_FILE": "/proc/nope/secret.key"}, "error: PLURK_SECRET_FILE=/proc/nope/secret.key: "),
    ({"PLURK_DATABASE_URL": "sqlite:////proc/nope/x.db"}, "error: PLURK_DATABASE_URL=sqlite:////proc/nope/x.db: "
                                                          "cannot create the directory /proc/nope"),
])
def test_manage_py_says_what_it_cannot_read_or_create_in_one_line(tmp_path, env, words):
    env = {**os.environ, "PLURK_VAR_DIR": str(tmp_path), "PLURK_SECRET_FILE": str(tmp_path / "secret.key"),
           "PLURK_DATABASE_URL": f"sqlite:///{tmp_path}/db.sqlite3", **env}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "manage.py"), "check"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and proc.stderr.startswith(words), proc.stderr


def test_parse_ipv6():
    assert parse_hostport("X", "[::1]:11211") == ("::1", 11211)


def test_sqlite_absolute_and_relative_paths():
    assert StackConfig.from_env({"PLURK_DATABASE_URL": "sqlite:////tmp/x.db"}).sqlite_path == "/tmp/x.db"
    assert StackConfig.from_env({"PLURK_DATABASE_URL": "sqlite:///rel/x.db"}).sqlite_path.endswith("/rel/x.db")


def test_fastpath_on_a_unix_socket_round_trips():
    config = StackConfig.from_env({"PLURK_FASTPATH": "unix:/run/plurk/fastpath.sock"})
    assert config.fastpath == ("unix", "/run/plurk/fastpath.sock")
    assert config.to_env()["PLURK_FASTPATH"] == "unix:/run/plurk/fastpath.sock"
    assert StackConfig.from_env(config.to_env()) == config


def test_the_default_socket_and_relative_socket_paths_follow_the_var_dir():
    """Each stack (each PLURK_VAR_DIR) gets a socket of its own; the children, handed to_env(),
    get the absolute path."""
    config = StackConfig.from_env({"PLURK_VAR_DIR": "/srv/plurk"})
    assert config.fastpath == ("unix", "/srv/plurk/run/fastpath.sock")
    assert config.to_env()["PLURK_FASTPATH"] == "unix:/srv/plurk/run/fastpath.sock"
    assert StackConfig.from_env(config.to_env()) == config
    relative = StackConfig.from_env({"PLURK_VAR_DIR": "/srv/plurk", "PLURK_FASTPATH": "unix:sockets/fp.sock"})
    assert relative.fastpath == ("unix", "/srv/plurk/sockets/fp.sock")
    in_checkout = StackConfig.from_env({"PLURK_VAR_DIR": "elsewhere"})
    elsewhere = os.path.join(ROOT, "elsewhere")
    assert in_checkout.fastpath == ("unix", _in_var_dir_or_run_plurk(os.path.join(elsewhere, "run", "fastpath.sock"),
                                                                       elsewhere))


def test_fastpath_over_tcp_stays_supported():
    config = StackConfig.from_env({"PLURK_FASTPATH": "127.0.0.1:8001"})
    assert config.fastpath == ("127.0.0.1", 8001)
    assert StackConfig.from_env(config.to_env()) == config


@pytest.mark.parametrize("value", ["unix:", "unix:/" + "x" * 200])
def test_bad_unix_socket_path_names_the_variable(value):
    with pytest.raises(ConfigError, match="PLURK_FASTPATH"):
        StackConfig.from_env({"PLURK_FASTPATH": value})


def test_a_var_dir_too_deep_for_the_default_socket_names_the_fix():
    with pytest.raises(ConfigError, match=r"PLURK_FASTPATH='unix:run/fastpath.sock': the socket path /x+/run"
                                          r"/fastpath.sock is over 107 bytes; set PLURK_FASTPATH to a shorter"):
        StackConfig.from_env({"PLURK_VAR_DIR": "/" + "x" * 100})


def test_readme_configuration_table_is_the_variables():
    from plurksite.config import readme_table

    with open(os.path.join(ROOT, "README.md")) as fh:
        readme = fh.read()
    assert readme_table(readme) == variables_table(), "run .venv/bin/python -m plurksite.config"


def test_one_row_per_variable_and_per_field():
    """Every StackConfig field is set by exactly one row, every row names a PLURK_* variable once."""
    import dataclasses

    names = [var.name for var in VARIABLES]
    assert len(set(names)) == len(names) and all(n.startswith("PLURK_") for n in names)
    attrs = [a for var in VARIABLES for a in (var.attr if isinstance(var.attr, tuple) else (var.attr,))]
    assert sorted(attrs) == sorted(f.name for f in dataclasses.fields(StackConfig))


def test_children_get_every_variable_of_the_table():
    config = StackConfig.from_env({})
    assert list(config.to_env()) == [var.name for var in VARIABLES]


@pytest.mark.parametrize("var", VARIABLES, ids=lambda var: var.name)
def test_each_default_parses_and_formats_back(var):
    """The table's default is a value its own parser takes, and what the children are handed
    for it parses to the same configuration."""
    config = StackConfig.from_env({var.name: var.default} if var.default_of is None else {})
    handed = config.to_env()[var.name]
    assert StackConfig.from_env({var.name: handed}) == config


@pytest.mark.parametrize("var", [v for v in VARIABLES if v.parse.__qualname__.startswith("_integer")],
                         ids=lambda var: var.name)
def test_each_number_refuses_words_naming_itself(var):
    with pytest.raises(ConfigError, match=f"^{var.name}='many': expected a whole number from"):
        StackConfig.from_env({var.name: "many"})


def test_the_readme_writer_rewrites_only_the_table(tmp_path):
    from plurksite.config import README_END, README_START, write_readme

    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{README_START}\nold table\n{README_END}\nafter\n")
    write_readme(str(readme))
    assert readme.read_text() == f"before\n{README_START}\n{variables_table()}{README_END}\nafter\n"


def test_one_body_limit_for_nginx_django_and_fastpath(tmp_path):
    from plurksite import nginxconf, services

    config = StackConfig.from_env({"PLURK_MAX_BODY_KB": "16", "PLURK_VAR_DIR": str(tmp_path)})
    assert config.max_body_bytes == 16384
    argv = services.fastpath_command(config)
    assert argv[argv.index("--max-body") + 1] == "16384"
    text = open(nginxconf.render(config)).read()
    assert "client_max_body_size 16k;" in text and "client_body_buffer_size 16k;" in text
    assert "{{" not in text


def test_the_demo_names_its_poll_cookie_plurk_token():
    """The library's default cookie is fastpoll_token (fastpoll.conf, fastpath --cookie-name);
    the demo keeps its own name, on both sides."""
    from fastpoll import conf
    from plurksite import services

    config = StackConfig.from_env({})
    assert conf.DEFAULTS["COOKIE_NAME"] == "fastpoll_token"
    assert services.fastpoll_settings(config)["COOKIE_NAME"] == "plurk_token"
    argv = services.fastpath_command(config)
    assert argv[argv.index("--cookie-name") + 1] == "plurk_token"


def test_runner_hands_fastpath_the_registered_poll_resources():
    from plurksite import services

    config = StackConfig.from_env({})
    argv = services.fastpath_command(config, ["getMessages", "getUnreadCount", "getMentions"])
    assert argv[argv.index("--resources") + 1] == "getMessages,getUnreadCount,getMentions"
    # none given: the demo's own, as fastpath has no default list
    argv = services.fastpath_command(config)
    assert argv[argv.index("--resources") + 1] == "getMessages,getUnreadCount"


def test_the_demos_resources_are_plurkcores_registered_ones():
    """services is Django-free, so it names plurkcore's resources itself: the same as the registry's."""
    from fastpoll import commandline
    from plurksite import services

    assert sorted(services.RESOURCES) == commandline.registered("user")
    assert sorted(services.OBJECT_RESOURCES) == commandline.registered("object")


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user nginx's workers run as that user")
def test_default_socket_leaves_a_var_dir_nginx_cannot_reach(tmp_path):
    """A checkout in /root (0700), run as root: nginx's workers (nobody) could not reach
    var/run/fastpath.sock, so the default socket goes to /run/plurk/<digest>/ instead of making
    `make run` refuse to start; an explicit PLURK_FASTPATH is never moved."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    var_dir = str(private / "var")
    config = StackConfig.from_env({"PLURK_VAR_DIR": var_dir})
    assert config.fastpath[0] == "unix" and config.fastpath[1].startswith("/run/plurk/")
    assert StackConfig.from_env({"PLURK_VAR_DIR": var_dir}).fastpath == config.fastpath  # stable
    other = StackConfig.from_env({"PLURK_VAR_DIR": str(private / "other")})
    assert other.fastpath != config.fastpath                                           # one per stack
    explicit = StackConfig.from_env({"PLURK_VAR_DIR": var_dir, "PLURK_FASTPATH": "unix:run/fp.sock"})
    assert explicit.fastpath == ("unix", os.path.join(var_dir, "run", "fp.sock"))


def test_long_poll_settings_follow_the_var_dir_and_can_be_off():
    config = StackConfig.from_env({"PLURK_VAR_DIR": "/srv/plurk"})
    assert config.fastpath_notify == "/srv/plurk/run/notify"
    assert config.longpoll_max_wait_s == 55
    assert StackConfig.from_env(config.to_env()) == config
    for off in ("off", "", "OFF"):
        assert StackConfig.from_env({"PLURK_FASTPATH_NOTIFY": off}).fastpath_notify is None
    other = StackConfig.from_env({"PLURK_FASTPATH_NOTIFY": "/tmp/n", "PLURK_LONGPOLL_MAX_WAIT_S": "20"})
    assert (other.fastpath_notify, other.longpoll_max_wait_s) == ("/tmp/n", 20)
    assert StackConfig.from_env(other.to_env()) == other


@pytest.mark.parametrize("env, words", [
    ({"PLURK_LONGPOLL_MAX_WAIT_S": "0"}, "PLURK_LONGPOLL_MAX_WAIT_S"),
    ({"PLURK_LONGPOLL_MAX_WAIT_S": "soon"}, "PLURK_LONGPOLL_MAX_WAIT_S"),
    ({"PLURK_FASTPATH_NOTIFY": "/" + "n" * 100}, "PLURK_FASTPATH_NOTIFY=.*too long"),
])
def test_bad_long_poll_settings_name_the_variable(env, words):
    with pytest.raises(ConfigError, match=words):
        StackConfig.from_env(env)


def test_django_sends_notices_to_the_configured_directory():
    import subprocess
    import sys

    code = "from plurksite import settings; print(settings.FASTPOLL['NOTIFY_DIRS'])"
    for value, expected in (("/tmp/notify-here", "['/tmp/notify-here']"), ("off", "[]")):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                             env=dict(os.environ, PLURK_FASTPATH_NOTIFY=value)).stdout
        assert out.strip() == expected


def test_runner_hands_fastpath_the_long_poll_settings():
    from plurksite import services

    config = StackConfig.from_env({"PLURK_FASTPATH_NOTIFY": "/tmp/n", "PLURK_LONGPOLL_MAX_WAIT_S": "20"})
    argv = services.fastpath_command(config)
    assert argv[argv.index("--max-wait") + 1] == "20"
    assert argv[argv.index("--notify-dir") + 1] == "/tmp/n"
    assert "--notify-dir" not in services.fastpath_command(StackConfig.from_env({"PLURK_FASTPATH_NOTIFY": "off"}))


def test_runner_always_hands_fastpath_the_long_poll_flags():
    """Every option is known to fastpath now: --max-wait always, --notify-dir unless notices are off."""
    from plurksite import services

    argv = services.fastpath_command(StackConfig.from_env({}))
    assert "--max-wait" in argv and "--notify-dir" in argv


def test_is_local_address_is_true_only_for_this_hosts_addresses():
    from plurksite.config import is_local_address

    assert is_local_address("127.0.0.1") and is_local_address("127.0.0.9")
    assert not is_local_address("192.0.2.1")        # TEST-NET-1: never configured here


# ---- PLURK_FASTPATH_NOTIFY=udp:...: notices to the fastpath workers of every web host (issue 16) ----

CLUSTER = "udp:10.77.0.21:9100-9101,udp:10.77.0.22:9100-9101"


def test_udp_notify_entries_parse_and_round_trip():
    config = StackConfig.from_env({"PLURK_FASTPATH_NOTIFY": CLUSTER})
    assert config.fastpath_notify is None
    assert config.fastpath_notify_udp == (("10.77.0.21", 9100, 9101), ("10.77.0.22", 9100, 9101))
    assert config.notify_udp_destinations == ["10.77.0.21:9100", "10.77.0.21:9101",
                                              "10.77.0.22:9100", "10.77.0.22:9101"]
    assert config.to_env()["PLURK_FASTPATH_NOTIFY"] == CLUSTER
    assert StackConfig.from_env(config.to_env()) == config
    one = StackConfig.from_env({"PLURK_FASTPATH_NOTIFY": " udp:[::1]:9100 , UDP:127.0.0.1:9200-9203"})
    assert one.fastpath_notify_udp == (("::1", 9100, 9100), ("127.0.0.1", 9200, 9203))
    assert StackConfig.from_env(one.to_env()) == one
    assert one.to_env()["PLURK_FASTPATH_NOTIFY"] == "udp:[::1]:9100,udp:127.0.0.1:9200-9203"
    # a directory stays what it was
    assert StackConfig.from_env({"PLURK_FASTPATH_NOTIFY": "/tmp/n"}).fastpath_notify_udp == ()


@pytest.mark.parametrize("value, words", [
    ("udp:10.77.0.21:0", "bad entry 'udp:10.77.0.21:0': ports are 1..65535"),
    ("udp:10.77.0.21:65536", "ports are 1..65535"),
    ("udp:10.77.0.21:91x0", "expected udp:HOST:PORT or udp:HOST:FIRST-LAST"),
    ("udp:10.77.0.21", "expected udp:HOST:PORT or udp:HOST:FIRST-LAST"),
    ("udp:10.77.0.21:9101-9100", "the last port is below the first"),
    ("udp:web1:9100", "HOST must be a numeric address"),
    ("run/notify,udp:10.77.0.21:9100", "'run/notify' is not a udp: entry; give either one directory"),
    ("udp:10.77.0.21:9100-9101,udp:10.77.0.21:9101", "10.77.0.21:9101 is in two entries"),
])
def test_bad_udp_notify_entries_are_one_line_errors(value, words):
    with pytest.raises(ConfigError) as info:
        StackConfig.from_env({"PLURK_FASTPATH_NOTIFY": value})
    message = str(info.value)
    assert message.startswith("PLURK_FASTPATH_NOTIFY") and words in message and "\n" not in message


def test_django_sends_udp_notices_to_every_port_of_every_entry():
    import subprocess
    import sys

    code = ("from plurksite import settings; p = settings.FASTPOLL; "
            "print(p['NOTIFY_BACKEND'], p['NOTIFY_UDP'], p['NOTIFY_DIRS'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env=dict(os.environ, PLURK_FASTPATH_NOTIFY=CLUSTER)).stdout
    assert out.split(" ", 1) == ["fastpoll.notify.UdpNotifier",
                                 "['10.77.0.21:9100', '10.77.0.21:9101', '10.77.0.22:9100', '10.77.0.22:9101'] []\n"]


def test_runner_gives_fastpath_only_this_hosts_udp_entry():
    from plurksite import services

    env = {"PLURK_FASTPATH_NOTIFY": "udp:127.0.0.1:9100-9101,udp:192.0.2.1:9100-9101",
           "PLURK_FASTPATH_WORKERS": "2"}
    argv = services.fastpath_command(StackConfig.from_env(env))
    assert argv[argv.index("--notify-udp") + 1] == "127.0.0.1:9100" and argv.count("--notify-udp") == 1
    assert "--notify-dir" not in argv
    elsewhere = dict(env, PLURK_FASTPATH_NOTIFY="udp:192.0.2.1:9100-9101")      # not this host
    assert "--notify-udp" not in services.fastpath_command(StackConfig.from_env(elsewhere))


@pytest.mark.parametrize("notify, workers, words", [
    ("udp:127.0.0.1:9100-9101,udp:127.0.0.2:9100-9101", "2", "has 2 entries of this host"),
    ("udp:127.0.0.1:9100-9101", "0", "set PLURK_FASTPATH_WORKERS=2"),
    ("udp:127.0.0.1:9100-9102", "2", "has 3 port(s) but PLURK_FASTPATH_WORKERS=2"),
])
def test_runner_refuses_a_udp_entry_that_does_not_fit_this_host(notify, workers, words):
    from plurksite import services

    config = StackConfig.from_env({"PLURK_FASTPATH_NOTIFY": notify, "PLURK_FASTPATH_WORKERS": workers})
    with pytest.raises(services.ServiceError) as info:
        services.fastpath_command(config)
    assert words in str(info.value) and "\n" not in str(info.value)


# ---- the edge (PLURK_EDGE*): fastpath's listener that pages poll without nginx ----

def test_the_edge_is_on_by_default_on_loopback_for_the_sites_origins():
    from plurksite import services

    config = StackConfig.from_env({"PLURK_HTTP": "127.0.0.1:9090"})
    assert config.edge == ("127.0.0.1", 8003) and config.edge_url is None
    assert config.edge_origins == ("http://127.0.0.1:9090", "http://localhost:9090")
    assert StackConfig.from_env(config.to_env()) == config
    argv = services.fastpath_command(config)
    assert argv[argv.index("--edge") + 1] == "127.0.0.1:8003"
    assert argv[argv.index("--edge-origins") + 1] == "http://127.0.0.1:9090,http://localhost:9090"
    assert argv[argv.index("--max-held-per-user") + 1] == "32"        # PLURK_MAX_HELD_PER_USER
    fastpoll = services.fastpoll_settings(config)
    assert (fastpoll["EDGE_ADDRESS"], fastpoll["EDGE_URL"]) == ("127.0.0.1:8003", None)


def test_the_edges_per_address_caps_reach_fastpoll_and_fastpath():
    from plurksite import services

    config = StackConfig.from_env({})
    assert (config.edge_max_per_address, config.edge_max_conns_per_address) == (64, None)
    assert config.to_env()["PLURK_EDGE_MAX_CONNS_PER_ADDRESS"] == ""
    assert "--edge-max-conns-per-address" not in services.fastpath_command(config)    # fastpath's: 2 x 64
    lifted = StackConfig.from_env({"PLURK_EDGE_MAX_PER_ADDRESS": "0", "PLURK_EDGE_MAX_CONNS_PER_ADDRESS": "0"})
    assert StackConfig.from_env(lifted.to_env()) == lifted
    fastpoll = services.fastpoll_settings(lifted)
    assert (fastpoll["EDGE_MAX_PER_ADDRESS"], fastpoll["EDGE_MAX_CONNS_PER_ADDRESS"]) == (0, 0)
    argv = services.fastpath_command(lifted)
    assert argv[argv.index("--edge-max-per-address") + 1] == "0"
    assert argv[argv.index("--edge-max-conns-per-address") + 1] == "0"
    argv = services.fastpath_command(StackConfig.from_env({"PLURK_EDGE_MAX_CONNS_PER_ADDRESS": " 500 "}))
    assert argv[argv.index("--edge-max-conns-per-address") + 1] == "500"
    with pytest.raises(ConfigError, match=r"^PLURK_EDGE_MAX_CONNS_PER_ADDRESS='-1': expected a whole number "
                                          r"from 0 to 1048576 or nothing$"):
        StackConfig.from_env({"PLURK_EDGE_MAX_CONNS_PER_ADDRESS": "-1"})


def test_fastpath_options_no_variable_sets_go_over_the_stacks_own():
    """What a benchmark gives Stack(fastpath_options=...) (services.commands) reaches fastpath."""
    from plurksite import services

    config = StackConfig.from_env({})
    argv = next(c.argv for c in services.commands(config, fastpath_options={"max_connections": 900, "max_wait": 7})
                if c.name == "fastpath")
    assert argv[argv.index("--max-connections") + 1] == "900" and argv[argv.index("--max-wait") + 1] == "7"
    plain = next(c.argv for c in services.commands(config) if c.name == "fastpath")
    assert plain[plain.index("--max-wait") + 1] == "55" and plain == services.fastpath_command(config)


def test_an_empty_plurk_edge_runs_no_edge():
    from plurksite import services

    config = StackConfig.from_env({"PLURK_EDGE": ""})
    assert config.edge is None and config.to_env()["PLURK_EDGE"] == ""
    assert StackConfig.from_env(config.to_env()) == config
    argv = services.fastpath_command(config)
    assert not [a for a in argv if a.startswith("--edge")]
    # the per-user cap holds without an edge too: one token cannot take everyone's slots
    assert argv[argv.index("--max-held-per-user") + 1] == "32"
    assert "EDGE_ADDRESS" not in services.fastpoll_settings(config)


def test_the_default_edge_origins_are_the_sites_public_names_on_its_scheme():
    config = StackConfig.from_env({"PLURK_PUBLIC_HOSTS": "www.example.com,.example.com", "PLURK_HTTPS": "1",
                                   "PLURK_TRUSTED_PROXIES": "10.77.0.10",
                                   "PLURK_HTTP": "0.0.0.0:8080", "PLURK_EDGE": "0.0.0.0:8443",
                                   "PLURK_EDGE_URL": "https://poll.example.com",
                                   "PLURK_COOKIE_DOMAIN": ".example.com"})
    assert config.edge_origins == ("https://www.example.com",)         # a wildcard names no origin
    assert services.fastpoll_settings(config)["COOKIE_DOMAIN"] == ".example.com"
    plain = StackConfig.from_env({"PLURK_HTTP": "127.0.0.1:80"})
    assert plain.edge_origins == ("http://127.0.0.1", "http://localhost")   # never the default port
    # written by fastpath's own origin(): brackets, lower case, the default port left out
    v6 = StackConfig.from_env({"PLURK_HTTP": "[::1]:80", "PLURK_HTTPS": "1", "PLURK_PUBLIC_HOSTS": "WWW.Example.com",
                               "PLURK_TRUSTED_PROXIES": "::1"})
    assert v6.edge_origins == ("http://[::1]", "http://localhost", "https://www.example.com")


def test_a_public_edge_with_its_url_and_origins():
    from plurksite import services

    env = {"PLURK_EDGE": "0.0.0.0:8443", "PLURK_EDGE_URL": "https://poll.example.com",
           "PLURK_EDGE_ORIGINS": "https://www.example.com, https://example.com"}
    config = StackConfig.from_env(env)
    assert config.edge_origins == ("https://www.example.com", "https://example.com")
    assert StackConfig.from_env(config.to_env()) == config
    argv = services.fastpath_command(config)
    assert argv[argv.index("--edge") + 1] == "0.0.0.0:8443"
    assert services.fastpoll_settings(config)["EDGE_URL"] == "https://poll.example.com"


@pytest.mark.parametrize("env, line", [
    ({"PLURK_EDGE": "8003"}, "PLURK_EDGE='8003': expected host:port, for example 127.0.0.1:8080"),
    ({"PLURK_EDGE": "127.0.0.1:8000"}, "PLURK_EDGE and PLURK_DJANGO both use 127.0.0.1:8000"),
    ({"PLURK_EDGE": "0.0.0.0:8443"}, "PLURK_EDGE='0.0.0.0:8443' is not a loopback address: set PLURK_EDGE_URL to "
                                     "the URL browsers reach it by, for example https://poll.example.com"),
    ({"PLURK_EDGE_URL": "poll.example.com"}, "PLURK_EDGE_URL='poll.example.com': expected the URL browsers reach "
                                             "the edge by, http(s)://host[:port] without a path, for example "
                                             "https://poll.example.com"),
    ({"PLURK_EDGE_ORIGINS": "https://www.example.com/"},
     "PLURK_EDGE_ORIGINS: bad --edge-origins entry 'https://www.example.com/': an origin as a browser sends it, "
     "scheme://host[:port] in lower case without a path, e.g. https://www.example.com"),
    ({"PLURK_EDGE_ORIGINS": "https://www.example.com:443"},
     "PLURK_EDGE_ORIGINS: bad --edge-origins entry 'https://www.example.com:443': a browser never sends its "
     "scheme's default port in an Origin, so it would never match; write 'https://www.example.com'"),
    ({"PLURK_HTTPS": "1", "PLURK_EDGE": "0.0.0.0:8443", "PLURK_EDGE_URL": "http://poll.example.com",
      "PLURK_PUBLIC_HOSTS": "www.example.com", "PLURK_TRUSTED_PROXIES": "10.77.0.10"},
     "PLURK_HTTPS=1 but PLURK_EDGE_URL='http://poll.example.com' is plain http: a page served over https cannot "
     "use it (mixed content, and the Secure poll cookie is not sent); give the edge's https:// URL"),
    ({"PLURK_HTTP": "0.0.0.0:8080", "PLURK_EDGE": "0.0.0.0:8443", "PLURK_EDGE_URL": "https://poll.example.com"},
     "PLURK_EDGE_ORIGINS is empty (PLURK_HTTP listens on every address and PLURK_PUBLIC_HOSTS names no host): "
     "set it to the origins of the site's pages, for example https://www.example.com"),
    ({"PLURK_TRUSTED_PROXIES": "10.0.0.1,0.0.0.0/0"},
     "PLURK_TRUSTED_PROXIES='10.0.0.1,0.0.0.0/0': '0.0.0.0/0' would trust the forwarded headers of clients "
     "anywhere (anyone could claim any address and escape the per-address caps); give the balancers' own "
     "addresses or subnet, for example 10.77.0.10"),
    ({"PLURK_COOKIE_DOMAIN": ".com"},
     "PLURK_COOKIE_DOMAIN='.com': expected the site's registrable domain or a parent of it, for example "
     ".example.com (a browser refuses a cookie for a public suffix such as .com)"),
])
def test_bad_edge_settings_are_one_line_naming_the_variable(env, line):
    with pytest.raises(ConfigError) as info:
        StackConfig.from_env(env)
    assert str(info.value) == line


HTTPS_UNTRUSTED = ("PLURK_HTTPS=1 but PLURK_TRUSTED_PROXIES is empty: this web host would take the https site "
                   "for plain http and refuse every browser login (CSRF 403); set PLURK_TRUSTED_PROXIES to the "
                   "balancer's address, for example 10.77.0.10 (127.0.0.1 when it runs on this host)")


@pytest.mark.parametrize("roles", ["web", "web,memcached,repair", "all"])
def test_https_on_a_web_host_that_trusts_no_balancer_is_refused(roles):
    # behind the https balancer it would take X-Forwarded-Proto from no one, see http, and
    # Django would answer every browser login 403 (CSRF): refused before anything starts
    with pytest.raises(ConfigError) as info:
        StackConfig.from_env({"PLURK_ROLES": roles, "PLURK_HTTPS": "1"})
    assert str(info.value) == HTTPS_UNTRUSTED
    trusting = StackConfig.from_env({"PLURK_ROLES": roles, "PLURK_HTTPS": "1", "PLURK_TRUSTED_PROXIES": "10.77.0.10"})
    assert trusting.https and trusting.trusted_proxies == ("10.77.0.10/32",)


@pytest.mark.parametrize("roles", ["balancer", "balancer,memcached", "memcached", "repair"])
def test_https_needs_no_trusted_proxy_where_no_web_host_runs(roles):
    # the balancer terminates TLS itself (its $scheme is https); memcached and repair serve no
    # page: the shared PLURK_HTTPS=1 is theirs too and they take it as it is
    config = StackConfig.from_env({"PLURK_ROLES": roles, "PLURK_HTTPS": "1", "PLURK_HTTP": "10.77.0.10:80",
                                   "PLURK_WEB_HOSTS": "10.77.0.21:8080", "PLURK_EDGE": ""})
    assert config.https and config.trusted_proxies == ()
