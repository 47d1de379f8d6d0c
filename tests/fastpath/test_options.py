"""The option table (fastpath/options.py, OPTIONS) against everything generated from it or that
must agree with it: C's FP_CONFIG_SCALARS (field names and defaults), --help, the runner's
command line (plurksite.services.fastpath_command), and the round trip
command line -> Options -> fp_config_t."""
import re
import socket

import pytest

import fastpath
from fastpath import _server  # a build that does not import fails here, never skips
from fastpath.options import OPTIONS, Options, build_parser, command_line, origin
from plurksite import services
from plurksite.config import StackConfig
from tests.fastpath.conftest import RESOURCES, SECRET, token

C_OPTIONS = [opt for opt in OPTIONS if opt.c_field is not None]

# non-default values for the options a range or choices cannot give one for; a new option of
# that kind needs a line here
SAMPLES = {
    "listen": "127.0.0.1:9",
    "admin": "127.0.0.1:10",
    "memcached": ("127.0.0.1:11", "[::1]:12"),
    "secret_file": "/nonexistent/secret.key",
    "resources": ("getMentions",),
    "notify_dir": "/run/plurk/notify",
    "notify_udp": "10.77.0.21:9100",
    "cookie_name": "sessionid_poll",
    "path_prefix": "/api/v2/poll/",
    "key_prefix": "fp-2",
    "object_resources": ("thread", "room"),
    "edge": "127.0.0.1:13",
    "edge_origins": ("https://www.example.com", "http://localhost:8000"),
}


# the C options whose default (None in the table) validate() derives from another option's value
DERIVED = {
    "edge_max_conns_per_address": lambda opts: min(2 * opts.edge_max_per_address, 1 << 20),
}


def _c_default(opt, opts):
    """What C gets for ``opt`` when it is not given, the other options being ``opts``'s."""
    return DERIVED[opt.attr](opts) if opt.default is None else opt.default


def test_derived_defaults_follow_their_option_and_yield_to_a_value_given():
    assert Options(secret=SECRET, resources=RESOURCES).validate().edge_max_conns_per_address == 128
    assert Options(secret=SECRET, resources=RESOURCES, edge_max_per_address=0).validate().edge_max_conns_per_address == 0
    assert Options(secret=SECRET, resources=RESOURCES, edge_max_per_address=5,
                   edge_max_conns_per_address=3).validate().edge_max_conns_per_address == 3


def _sample(opt):
    """A valid value of ``opt`` that is not its default."""
    if opt.attr in SAMPLES:
        return SAMPLES[opt.attr]
    if opt.choices:
        return next(c for c in opt.choices if c != opt.default)
    if opt.low is not None:
        return opt.high if opt.default != opt.high else opt.low
    raise AssertionError(f"add a non-default value of {opt.flag} to SAMPLES")


def test_the_table_has_one_row_per_flag_attribute_and_c_field():
    for column in ("flag", "attr", "c_field"):
        values = [getattr(opt, column) for opt in OPTIONS if getattr(opt, column) is not None]
        assert len(values) == len(set(values)), column


def test_c_config_fields_are_the_tables():
    """FP_CONFIG_SCALARS (fp_server.h) and the c_field column name the same fields: a field
    only C knows would keep its C default whatever the command line says."""
    assert set(_server.CONFIG_FIELDS) == {opt.c_field for opt in C_OPTIONS}


@pytest.mark.parametrize("opt", C_OPTIONS, ids=lambda opt: opt.flag)
def test_c_defaults_are_the_tables(opt):
    """fp_config_defaults (what the fuzz targets run with) and the CLI agree on every default
    (one derived from another option, default None in the table, as validate() derives it)."""
    assert _server._testhelper_config()[opt.c_field] == _c_default(opt, Options())


def test_defaults_nginx_forwards_are_accepted():
    """nginx forwards a request line of up to 8 KiB and header lines of up to 8 KiB each
    (large_client_header_buffers 4 8k): the default head limit takes all four."""
    assert Options().max_headers == _server._testhelper_config()["max_headers"] >= 4 * 8192


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda opt: opt.flag)
def test_help_shows_every_option_with_its_default_and_range(opt):
    text = " ".join(build_parser().format_help().split())     # undo argparse's wrapping
    assert opt.flag in text
    if opt.default is not None:
        assert f"default {opt.format(opt.default)}" in text
    if opt.low is not None:
        assert f"{opt.low}..{opt.high}" in text
    if opt.choices:
        assert "{" + ",".join(opt.choices) + "}" in text


def test_options_defaults_are_the_tables():
    opts = Options()
    for opt in OPTIONS:
        assert getattr(opts, opt.attr) == opt.default, opt.attr


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda opt: opt.flag)
def test_runner_command_line_carries_every_option(opt):
    """services.fastpath_command passes any option through, as the table spells it."""
    value = _sample(opt)
    argv = services.fastpath_command(StackConfig.from_env({}), **{opt.attr: value})
    assert argv[argv.index(opt.flag) + 1] == opt.format(value)
    assert argv.count(opt.flag) == 1


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda opt: opt.flag)
def test_every_option_round_trips_from_the_command_line_to_c(opt):
    value = _sample(opt)
    args = build_parser().parse_args(command_line(**{opt.attr: value}))
    opts = Options(**vars(args))
    assert getattr(opts, opt.attr) == value
    for other in OPTIONS:
        if other is not opt:
            assert getattr(opts, other.attr) == other.default, other.attr
    opts.secret = SECRET
    if opt.attr != "object_resources":             # per-object resources alone are a configuration
        opts.resources = opts.resources or RESOURCES
    config = _server._testhelper_config(opts.validate(), 3 if opt.attr == "workers" else 0)
    for c_opt in C_OPTIONS:
        assert config[c_opt.c_field] == (value if c_opt is opt else _c_default(c_opt, opts)), c_opt.c_field
    # the options that stay in Python, where C sees them
    assert config["node_names"] == opts.node_names and config["node_addrs"] == opts.node_addrs
    assert config["resources"] == list(opts.resources or ())
    assert config["object_resources"] == list(opts.object_resources or ())
    assert config["n_workers"] == opts.workers and config["secret"] == SECRET
    assert config["backend_avoid"] == opts.avoid_backends()
    assert config["notify_udp"] == (("10.77.0.21", 9100) if opt.attr == "notify_udp" else None)
    if opt.attr == "memcached":
        assert config["node_names"] == ["127.0.0.1:11", "::1:12"]        # as pymemcache names them
        assert config["node_addrs"] == ["127.0.0.1:11", "[::1]:12"]      # as libevent parses them
    elif opt.attr == "backend":
        assert config["backend_avoid"] == [b for b in opt.choices if b != value]
    elif opt.attr == "workers":
        assert config["n_workers"] == value and config["worker_index"] == 3


def test_fp_config_set_refuses_what_its_field_cannot_hold():
    """C checks each value against its field's type: an option table with a wider range than
    the C field fails loudly instead of truncating."""
    opts = Options(secret=SECRET, resources=RESOURCES).validate()
    opts.timeout_ms = 2 ** 31
    with pytest.raises(fastpath.FastpathError, match="--timeout-ms 2147483648: fp_config_t"):
        _server._testhelper_config(opts)
    opts.timeout_ms = -1
    with pytest.raises(fastpath.FastpathError, match="--timeout-ms -1: fp_config_t"):
        _server._testhelper_config(opts)


def test_options_are_typed():
    with pytest.raises(TypeError):
        Options(workers="2")
    with pytest.raises(TypeError):
        Options(max_body=True)
    with pytest.raises(TypeError):
        Options(resources=[1, 2])
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_header'"):
        Options(max_header=1024)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_header'"):
        command_line(max_header=1024)
    opts = Options()
    with pytest.raises(TypeError):
        opts.idle_timeout = "10"
    with pytest.raises(AttributeError):
        opts.idle_timout = 10                   # a misspelt attribute is an error, not a no-op


def test_memcached_host_name_keeps_its_name_and_connects_to_its_address():
    """Rendezvous hashing scores the node name as written (pymemcache does); C connects to the
    first address the name resolves to, the one pymemcache connects to."""
    first = socket.getaddrinfo("localhost", 11211, socket.AF_UNSPEC, socket.SOCK_STREAM,
                               socket.IPPROTO_TCP)[0][4][0]
    opts = Options(memcached="localhost:11211,127.0.0.1:11212", secret=SECRET, resources=RESOURCES).validate()
    assert opts.node_names == ["localhost:11211", "127.0.0.1:11212"]
    assert opts.node_addrs == [f"[{first}]:11211" if ":" in first else f"{first}:11211", "127.0.0.1:11212"]
    assert _server._testhelper_config(opts)["node_names"][0] == "localhost:11211"
    keys = [f"p1:getMessages:{uid}:0" for uid in range(200)]
    picks = {_server._testhelper_pick(opts.node_names, k.encode()) for k in keys}
    assert picks == {0, 1}


def test_memcached_host_name_that_does_not_resolve_is_refused_naming_the_fix():
    with pytest.raises(fastpath.FastpathError) as info:
        Options(memcached="nohost.invalid:11211", secret=SECRET, resources=RESOURCES).validate()
    assert str(info.value).startswith("--memcached server nohost.invalid:11211: cannot resolve "
                                      "'nohost.invalid' (")
    assert str(info.value).endswith("); give a numeric address such as 127.0.0.1:11211")
    assert not isinstance(info.value, fastpath.ConfigurationError)   # exit 1: the name, not the usage


def test_options_module_works_without_the_extension_loaded():
    """The runner builds fastpath's command line before it checks the extension is built."""
    import subprocess
    import sys
    code = ("import sys, fastpath.options as o; o.command_line(workers=2); "
            "assert not [m for m in sys.modules if m.startswith('fastpath._')], sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_a_head_as_large_as_nginx_forwards_is_answered(fastpath_factory, memcached):
    """Two 8 KiB header lines and more (under nginx's large_client_header_buffers 4 8k) get an
    answer from fastpath with its default limits, never 431."""
    from pymemcache.client.hash import HashClient
    import requests
    HashClient([memcached.spec], default_noreply=False).set("p1:getMessages:7:0", b'{"big":1}')
    fp = fastpath_factory([memcached])
    headers = {"Authorization": f"Bearer {token(7)}", "Cookie": "a=" + "c" * 8000,
               "X-Forwarded-For": "1" * 8000, "X-Other": "o" * 8000}
    resp = requests.get(f"{fp.url}/Poll/getMessages", headers=headers, timeout=5)
    assert (resp.status_code, resp.content) == (200, b'{"big":1}')


@pytest.mark.parametrize("kwargs", [
    {"listen": "127.0.0.1:²"}, {"listen": "[::1]:²"}, {"admin": "127.0.0.1:٨٠٠٢"},
    {"memcached": "127.0.0.1:١١٢١١"}, {"notify_udp": "10.77.0.21:９１００"},
], ids=lambda kw: next(iter(kw)))
def test_a_port_of_non_ascii_digits_is_refused(kwargs):
    """str.isdigit() takes '²' (int() refuses it: a traceback) and other scripts' digits: a
    port is ASCII digits, or a usage error."""
    with pytest.raises(fastpath.ConfigurationError, match="expected host:port"):
        Options(secret=SECRET, resources=RESOURCES, **kwargs).validate()


@pytest.mark.parametrize("listen, admin", [
    ("127.0.0.1:18001", "127.0.0.1:18001"),
    ("localhost:18001", "127.0.0.1:18001"),
    ("127.0.0.1:18001", "localhost:18001"),
    ("[::1]:18001", "[::1]:18001"),
    ("0.0.0.0:18001", "127.0.0.1:18001"),       # the wildcard takes the port on every address
    ("[::]:18001", "localhost:18001"),          # ... and :: on IPv4's too (dual stack)
])
def test_admin_on_the_listen_address_is_refused(listen, admin):
    """Both bind with SO_REUSEPORT, so the kernel would hand polls to the admin socket (404)."""
    with pytest.raises(fastpath.ConfigurationError,
                       match=rf"--admin {re.escape(admin)} is the address of --listen {re.escape(listen)}; "
                             rf"give --admin another port"):
        Options(listen=listen, admin=admin, secret=SECRET, resources=RESOURCES).validate()


@pytest.mark.parametrize("listen, admin", [
    ("127.0.0.1:18001", "127.0.0.1:18002"),
    ("127.0.0.1:18001", "127.0.0.2:18001"),
    ("0.0.0.0:18001", "[::1]:18001"),
    ("unix:/run/fastpath.sock", "127.0.0.1:18001"),
])
def test_admin_on_another_address_or_port_is_accepted(listen, admin):
    Options(listen=listen, admin=admin, secret=SECRET, resources=RESOURCES).validate()


@pytest.mark.parametrize("notify_dir, workers, fits", [
    ("/" + "n" * 99, 10, True),              # /nnn.../9.sock: 107 bytes, sun_path's most
    ("/" + "n" * 99, 11, False),             # /nnn.../10.sock: 108
    ("/" + "n" * 100, 1, False),
    ("/" + "é" * 50, 1, False),              # 108 bytes in 58 characters
    ("n" * 100, 1, True),                    # bound relative, as given (fp_notify.c)
], ids=["107-bytes", "108-for-worker-10", "108-bytes", "108-bytes-58-characters", "relative"])
def test_notify_dir_must_leave_room_for_every_workers_socket(notify_dir, workers, fits):
    """Worker i binds <dir>/<i>.sock: a path longer than sun_path fails in every worker (a
    restart loop), so it is refused before anything starts."""
    opts = Options(notify_dir=notify_dir, workers=workers, secret=SECRET, resources=RESOURCES)
    if fits:
        opts.validate()
        return
    with pytest.raises(fastpath.ConfigurationError, match=f"--notify-dir {notify_dir}: worker "
                                                          f"{workers - 1}'s socket <dir>/{workers - 1}.sock "
                                                          f"is 108 bytes, over the 107"):
        opts.validate()


def test_relative_unix_listen_is_measured_as_it_is_bound(tmp_path, monkeypatch):
    """unix:a.sock is bound at its absolute path: that one must fit in sun_path."""
    monkeypatch.chdir(tmp_path)
    opts = Options(listen="unix:a.sock", secret=SECRET, resources=RESOURCES).validate()
    assert opts.listen_addr == ("unix", str(tmp_path / "a.sock"))
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.chdir(deep)
    with pytest.raises(fastpath.ConfigurationError,
                       match=rf"bad --listen 'unix:a.sock': unix:<path of at most 107 bytes> "
                             rf"\(its absolute path has {len(str(deep / 'a.sock'))}\)"):
        Options(listen="unix:a.sock", secret=SECRET, resources=RESOURCES).validate()
    with pytest.raises(fastpath.ConfigurationError, match="unix:<path of at most 107 bytes>"):
        Options(listen="unix:", secret=SECRET, resources=RESOURCES).validate()


@pytest.mark.parametrize("attr, good, bad", [
    ("cookie_name", ["plurk_token", "a", "x" * 64, "__Host-tok", "!#$%&'*+-.^_`|~"],
     ["", "x" * 65, "a b", "a=b", "a;b", "a,b", 'a"b', "a/b", "caf\u00e9", "a\tb", "(a)"]),
    ("path_prefix", ["/Poll/", "/api/v2/poll/", "/a.b~c_d-e/", "/" + "p" * 62 + "/"],
     ["", "/", "Poll/", "/Poll", "//", "/a//b/", "/./", "/../", "/a/../", "/a b/", "/a?/", "/%41/",
      "/" + "p" * 63 + "/", "/caf\u00e9/"]),
    ("key_prefix", ["p1", "a", "x" * 16, "fp-2_b"], ["", "x" * 17, "p1:", "p 1", "p.1", "@", "caf\u00e9"]),
])
def test_names_a_project_chooses_are_checked(attr, good, bad):
    flag = "--" + attr.replace("_", "-")
    for value in good:
        opts = Options(secret=SECRET, resources=RESOURCES, **{attr: value}).validate()
        assert _server._testhelper_config(opts)[attr] == value
    for value in bad:
        with pytest.raises(fastpath.ConfigurationError, match=f"^bad {flag} ") as info:
            Options(secret=SECRET, resources=RESOURCES, **{attr: value}).validate()
        assert "\n" not in str(info.value)


def test_max_headers_help_says_what_the_code_does():
    """A head beyond --max-headers goes to Django (404 MISS) on --listen; the edge, with nothing
    behind it, refuses it with 431 (fp_http.c _unreadable, docs/contract.md section 10)."""
    help_text = next(opt for opt in OPTIONS if opt.attr == "max_headers").help
    assert "404 X-Cache: MISS on --listen" in help_text and "431 on --edge" in help_text


@pytest.mark.parametrize("args, sent", [
    (("https", "www.example.com", 443), "https://www.example.com"),
    (("http", "WWW.Example.com", 80), "http://www.example.com"),
    (("http", "127.0.0.1", 443), "http://127.0.0.1:443"),
    (("https", "::1", 8443), "https://[::1]:8443"),
    (("https", "[::1]", None), "https://[::1]"),
])
def test_an_origin_is_written_as_a_browser_sends_it_and_edge_origins_takes_it(args, sent):
    assert origin(*args) == sent
    Options(edge_origins=(sent,))._validate_edge()


@pytest.mark.parametrize("entry, why", [
    ("https://www.example.com:443", "a browser never sends its scheme's default port in an Origin, so it would "
                                    "never match; write 'https://www.example.com'"),
    ("http://[::1]:80", "a browser never sends its scheme's default port in an Origin, so it would never match; "
                        "write 'http://[::1]'"),
    ("http://localhost:08000", "a browser writes a port without leading zeros, so it would never match; "
                               "write 'http://localhost:8000'"),
])
def test_an_origin_a_browser_never_sends_is_refused_naming_the_one_it_sends(entry, why):
    with pytest.raises(fastpath.ConfigurationError, match=f"^bad --edge-origins entry {re.escape(repr(entry))}: "
                                                          f"{re.escape(why)}$"):
        Options(edge_origins=(entry,))._validate_edge()
