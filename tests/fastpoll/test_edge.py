"""The edge's settings (FASTPOLL["EDGE_*"], MAX_HELD_PER_USER, COOKIE_DOMAIN): rendered by
``manage.py fastpoll_fastpath`` into fastpath's --edge flags, judged by fastpoll.E016 / E017 /
W005 in the words the renderer refuses them with, and ``fastpoll.edge_url()`` for templates."""
import io
import json

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.http import HttpResponse
from django.test import RequestFactory, override_settings

import fastpoll
from fastpath.options import Options, build_parser
from fastpoll import auth, commandline
from fastpoll import checks as fastpoll_checks

SECRET = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
SITE = "https://www.example.com"
#: an edge behind a TCP balancer: every key an operator sets for one
PUBLIC_EDGE = {"EDGE_ADDRESS": "0.0.0.0:8443", "EDGE_URL": "https://poll.example.com", "EDGE_ORIGINS": [SITE],
               "EDGE_MAX_CONNECTIONS": 4096, "EDGE_MAX_PER_ADDRESS": 16, "MAX_HELD_PER_USER": 32,
               "EDGE_HEADER_TIMEOUT": 5, "COOKIE_DOMAIN": ".example.com"}


@pytest.fixture
def fastpoll_settings(settings, tmp_path):
    """The project's FASTPOLL without an edge, a secret fastpath can read and a KEY_PREFIX."""
    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET)
    base = {key: value for key, value in settings.FASTPOLL.items() if key not in ("EDGE_ADDRESS", "EDGE_URL",
                                                                                   "EDGE_ORIGINS", "MAX_HELD_PER_USER")}
    settings.FASTPOLL = dict(base, SECRET_FILE=str(secret), KEY_PREFIX="edge", FASTPATH_ADDRESS="127.0.0.1:8001",
                             FASTPATH_ADMIN="127.0.0.1:8002")
    return settings.FASTPOLL


def argv_of(settings, **edge):
    settings.FASTPOLL = dict(settings.FASTPOLL, **edge)
    out = io.StringIO()
    call_command("fastpoll_fastpath", "--format", "json", stdout=out)
    return json.loads(out.getvalue())


def parse(argv):
    """fastpath's own parser and checks over the flags (what `python -m fastpath` does first)."""
    return Options(**vars(build_parser().parse_args(argv[3:]))).validate()


def found(fastpoll_settings, **edge):
    with override_settings(FASTPOLL=dict(fastpoll_settings, **edge)):
        return [(e.id, e.msg) for e in checks.run_checks(tags=[fastpoll_checks.TAG]) if not e.is_silenced()]


# ---- rendering ----

def test_no_edge_no_edge_flags(fastpoll_settings, settings):
    argv = argv_of(settings)
    assert not [a for a in argv if a.startswith("--edge") or a == "--max-held-per-user"]
    assert parse(argv).edge is None


def test_the_edge_settings_become_fastpaths_flags(fastpoll_settings, settings):
    argv = argv_of(settings, **PUBLIC_EDGE)
    opts = parse(argv)
    assert (opts.edge, opts.edge_origins) == ("0.0.0.0:8443", (SITE,))
    assert (opts.edge_max_connections, opts.edge_max_per_address, opts.max_held_per_user,
            opts.edge_header_timeout) == (4096, 16, 32, 5)
    assert "https://poll.example.com" not in argv           # the URL is the page's, not fastpath's
    assert opts.edge_max_conns_per_address == 32             # unset: fastpath's twice the held cap
    assert parse(argv_of(settings, **PUBLIC_EDGE, EDGE_MAX_CONNS_PER_ADDRESS=100)).edge_max_conns_per_address == 100


def test_a_loopback_edge_needs_no_url_and_the_per_user_cap_goes_alone(fastpoll_settings, settings):
    opts = parse(argv_of(settings, EDGE_ADDRESS="127.0.0.1:8003", EDGE_ORIGINS=["http://127.0.0.1:8080",
                                                                              "http://localhost:8080"]))
    assert opts.edge == "127.0.0.1:8003" and opts.edge_origins == ("http://127.0.0.1:8080", "http://localhost:8080")
    assert opts.edge_max_per_address == 64 and opts.max_held_per_user == 0       # fastpath's defaults
    settings.FASTPOLL = {k: v for k, v in settings.FASTPOLL.items() if not k.startswith("EDGE_")}
    assert parse(argv_of(settings, MAX_HELD_PER_USER=8)).max_held_per_user == 8  # both listeners' cap


# ---- what `check` and the renderer refuse, in the same words ----

#: (settings, the one E016 line: what fastpoll_fastpath says)
EDGE_BAD = [
    ({"EDGE_ADDRESS": "poll.example.com"},
     "FASTPOLL['EDGE_ADDRESS']: fastpath bad --edge 'poll.example.com': expected host:port"),
    ({"EDGE_ADDRESS": "127.0.0.1:8003"},
     "FASTPOLL['EDGE_ADDRESS'] is set but FASTPOLL['EDGE_ORIGINS'] is empty: list the site origins whose pages "
     "poll the edge, such as ['https://www.example.com']"),
    ({"EDGE_ADDRESS": "0.0.0.0:8443", "EDGE_ORIGINS": [SITE]},
     "FASTPOLL['EDGE_ADDRESS'] = '0.0.0.0:8443' is not a loopback address: set FASTPOLL['EDGE_URL'] to the URL "
     "browsers reach the edge by, such as 'https://poll.example.com'"),
    ({"EDGE_ADDRESS": "127.0.0.1:8002", "EDGE_ORIGINS": [SITE]},
     "FASTPOLL['EDGE_ADDRESS']: fastpath --edge 127.0.0.1:8002 is the address of --admin 127.0.0.1:8002; give "
     "--edge another port"),
    ({"EDGE_ADDRESS": "127.0.0.1:8001", "EDGE_ORIGINS": [SITE]},
     "FASTPOLL['EDGE_ADDRESS']: fastpath --edge 127.0.0.1:8001 is the address of --listen 127.0.0.1:8001; give "
     "--edge another port"),
    ({"EDGE_ADDRESS": "127.0.0.1:8000", "EDGE_ORIGINS": [SITE], "DJANGO_UPSTREAM": "127.0.0.1:8000"},
     "FASTPOLL['EDGE_ADDRESS'] = '127.0.0.1:8000' is where nginx sends Django's requests (DJANGO_UPSTREAM "
     "'127.0.0.1:8000'): give the edge a port of its own"),
    ({"EDGE_MAX_CONNS_PER_ADDRESS": -1},
     "FASTPOLL['EDGE_MAX_CONNS_PER_ADDRESS']: fastpath --edge-max-conns-per-address must be in 0..1048576, got -1"),
    ({"EDGE_ORIGINS": SITE},
     "FASTPOLL['EDGE_ORIGINS'] must be a list of origins such as ['https://www.example.com'], got "
     "'https://www.example.com'"),
    ({"EDGE_ORIGINS": ["https://www.example.com/"]},
     "FASTPOLL['EDGE_ORIGINS']: fastpath bad --edge-origins entry 'https://www.example.com/': an origin as a "
     "browser sends it, scheme://host[:port] in lower case without a path, e.g. https://www.example.com"),
    ({"EDGE_URL": "https://poll.example.com/Poll/"},
     "FASTPOLL['EDGE_URL'] must be the URL browsers reach the edge by, http(s)://host[:port] without a path, "
     "such as 'https://poll.example.com', got 'https://poll.example.com/Poll/'"),
    ({"EDGE_MAX_CONNECTIONS": 0},
     "FASTPOLL['EDGE_MAX_CONNECTIONS']: fastpath --edge-max-connections must be in 1..1048576, got 0"),
    ({"EDGE_MAX_PER_ADDRESS": "64"},
     "FASTPOLL['EDGE_MAX_PER_ADDRESS']: fastpath edge_max_per_address must be an int, not str"),
    ({"MAX_HELD_PER_USER": -1},
     "FASTPOLL['MAX_HELD_PER_USER']: fastpath --max-held-per-user must be in 0..1048576, got -1"),
    ({"EDGE_HEADER_TIMEOUT": 0},
     "FASTPOLL['EDGE_HEADER_TIMEOUT']: fastpath --edge-header-timeout must be in 1..3600, got 0"),
]


@pytest.mark.parametrize("edge, line", EDGE_BAD, ids=[",".join(e) + f"-{i}" for i, (e, _) in enumerate(EDGE_BAD)])
def test_check_refuses_what_the_renderer_refuses_with_its_line(fastpoll_settings, settings, edge, line):
    assert found(fastpoll_settings, **edge) == [("fastpoll.E016", line + ".")]
    with pytest.raises(CommandError) as refused:
        argv_of(settings, **edge)
    assert str(refused.value) == line


def test_each_bad_edge_setting_is_reported_at_once(fastpoll_settings):
    bad = {"EDGE_MAX_CONNECTIONS": 0, "EDGE_HEADER_TIMEOUT": 0, "EDGE_URL": "poll.example.com"}
    assert [i for i, _ in found(fastpoll_settings, **bad)] == ["fastpoll.E016"] * 3


def test_a_public_edge_without_a_per_user_cap_is_warned_of(fastpoll_settings):
    assert found(fastpoll_settings, **PUBLIC_EDGE) == []
    [(check_id, message)] = found(fastpoll_settings, **dict(PUBLIC_EDGE, MAX_HELD_PER_USER=0))
    assert check_id == "fastpoll.W005" and "MAX_HELD_PER_USER is 0" in message
    # on loopback nobody else reaches it
    assert found(fastpoll_settings, EDGE_ADDRESS="127.0.0.1:8003", EDGE_ORIGINS=["http://127.0.0.1:8080"]) == []


@pytest.mark.parametrize("domain, ok", [(None, True), (".example.com", True), ("example.com", True),
                                        ("https://example.com", False), (".example.com:443", False), ("", False),
                                        (42, False)])
def test_cookie_domain(fastpoll_settings, domain, ok):
    expected = [] if ok else [("fastpoll.E017", f"FASTPOLL['COOKIE_DOMAIN'] must be None or a domain name such as "
                                                f"'.example.com', got {domain!r}.")]
    assert found(fastpoll_settings, COOKIE_DOMAIN=domain) == expected


def test_the_edge_settings_are_known_keys():
    assert set(fastpoll_checks._EDGE_EXAMPLES) == set(fastpoll.conf.EDGE_SETTINGS) <= set(fastpoll.conf.DEFAULTS)
    assert fastpoll_checks.check_edge in fastpoll_checks.CHECKS
    assert set(commandline.SETTING_OF_OPTION.values()) >= set(fastpoll.conf.EDGE_SETTINGS) - {"EDGE_URL"}


# ---- the poll cookie's domain ----

@pytest.mark.parametrize("fastpoll_domain, session_domain, expected", [
    (None, None, None), (None, ".site.example", ".site.example"), (".example.com", ".site.example", ".example.com")])
def test_the_poll_cookie_goes_to_cookie_domain(fastpoll_settings, settings, fastpoll_domain, session_domain,
                                               expected):
    settings.FASTPOLL = dict(fastpoll_settings, COOKIE_DOMAIN=fastpoll_domain)
    settings.SESSION_COOKIE_DOMAIN = session_domain
    response = HttpResponse()
    auth.set_cookie(response, "t.1.2.3.4")
    cookie = response.cookies[fastpoll.conf.get_config()["COOKIE_NAME"]]
    assert cookie["domain"] == (expected or "") and cookie["samesite"] == "Lax" and cookie["httponly"]
    gone = HttpResponse()
    auth.delete_cookie(gone)
    assert gone.cookies[fastpoll.conf.get_config()["COOKIE_NAME"]]["domain"] == (expected or "")


# ---- fastpoll.edge_url() ----

def _page(host):
    return RequestFactory().get("/", HTTP_HOST=host)


@pytest.mark.parametrize("edge, host, expected", [
    ({}, "127.0.0.1:8080", ""),
    ({"EDGE_URL": "https://poll.example.com"}, "www.example.com", "https://poll.example.com"),
    ({"EDGE_URL": "https://poll.example.com", "EDGE_ADDRESS": "0.0.0.0:8443"}, "127.0.0.1", "https://poll.example.com"),
    ({"EDGE_ADDRESS": "127.0.0.1:8003"}, "127.0.0.1:8080", "http://127.0.0.1:8003"),
    # the page's cookie is localhost's: the edge is asked by that name too
    ({"EDGE_ADDRESS": "127.0.0.1:8003"}, "localhost:8080", "http://localhost:8003"),
    ({"EDGE_ADDRESS": "[::1]:8003"}, "[::1]:8080", "http://[::1]:8003"),
    # a browser on another machine cannot reach this one's loopback
    ({"EDGE_ADDRESS": "127.0.0.1:8003"}, "testserver", ""),
    # nor does a page on another loopback address have the cookie of the edge's
    ({"EDGE_ADDRESS": "127.0.0.1:8003"}, "[::1]:8080", ""),
    ({"EDGE_ADDRESS": "127.0.0.1:8003"}, "127.0.0.2:8080", ""),
    ({"EDGE_ADDRESS": "0.0.0.0:8443"}, "127.0.0.1", ""),          # E016: EDGE_URL is required
    ({"EDGE_ADDRESS": "nope"}, "127.0.0.1", ""),
    # a page whose origin the edge does not answer (CORS) is not sent there
    ({"EDGE_URL": "https://poll.example.com"}, "evil.example", ""),
    ({"EDGE_ADDRESS": "127.0.0.1:8003"}, "127.0.0.1:8000", ""),
])
def test_edge_url(fastpoll_settings, settings, edge, host, expected):
    origins = [f"http://{h}" for h in ("www.example.com", "127.0.0.1", "127.0.0.1:8080", "localhost:8080",
                                       "[::1]:8080", "testserver", "127.0.0.2:8080")]
    settings.FASTPOLL = dict(fastpoll_settings, EDGE_ORIGINS=origins, **edge)
    settings.ALLOWED_HOSTS = ["*"]
    assert fastpoll.edge_url(_page(host)) == expected


def test_edge_url_without_a_request_is_the_address(fastpoll_settings, settings):
    settings.FASTPOLL = dict(fastpoll_settings, EDGE_ADDRESS="127.0.0.1:8003")
    assert fastpoll.edge_url() == "http://127.0.0.1:8003"
    assert "edge_url" in fastpoll.__all__


@pytest.fixture
def fresh_warnings():
    """edge_url's warnings are once per process: forget those of earlier tests."""
    from fastpoll import edge
    edge._warned.clear()
    yield
    edge._warned.clear()


@pytest.mark.parametrize("scheme, host", [("https", "www.example.com:443"), ("http", "www.example.com:80"),
                                          ("https", "WWW.Example.COM")])
def test_edge_url_reads_the_page_origin_as_a_browser_sends_it(fastpoll_settings, settings, scheme, host):
    """A Host with the scheme's default port (a proxy's `$host:$server_port`) or in capitals is
    the same origin to a browser, which sends none of that in Origin."""
    settings.FASTPOLL = dict(fastpoll_settings, **dict(PUBLIC_EDGE, EDGE_ORIGINS=[f"{scheme}://www.example.com"]))
    settings.ALLOWED_HOSTS = ["*"]
    page = RequestFactory().get("/", HTTP_HOST=host, secure=scheme == "https")
    assert fastpoll.edge_url(page) == "https://poll.example.com"


@pytest.mark.parametrize("page, causes", [
    # TLS at nginx without SECURE_PROXY_SSL_HEADER: the page looks http://
    (dict(HTTP_HOST="www.example.com", HTTP_X_FORWARDED_PROTO="https"), "SECURE_PROXY_SSL_HEADER"),
    # nginx's `proxy_set_header Host $host` on a port other than 80
    (dict(HTTP_HOST="www.example.com"), "$http_host"),
])
def test_a_page_refused_the_edge_is_logged_once_with_its_causes(fastpoll_settings, settings, caplog,
                                                                 fresh_warnings, page, causes):
    settings.FASTPOLL = dict(fastpoll_settings, **dict(PUBLIC_EDGE, EDGE_ORIGINS=[SITE, "http://www.example.com:8080"]))
    settings.ALLOWED_HOSTS = ["*"]
    settings.SECURE_PROXY_SSL_HEADER = None        # the project's settings set it
    with caplog.at_level("WARNING", logger="fastpoll.edge"):
        assert fastpoll.edge_url(RequestFactory().get("/", **page)) == ""
        assert fastpoll.edge_url(RequestFactory().get("/", **page)) == ""
    [record] = [r for r in caplog.records if r.name == "fastpoll.edge"]
    line = record.getMessage()
    assert "\n" not in line and "'http://www.example.com'" in line and repr(SITE) in line
    assert "SECURE_PROXY_SSL_HEADER" in line and "$http_host" in line and causes in line


def test_a_page_given_the_edge_or_without_an_edge_logs_nothing(fastpoll_settings, settings, caplog,
                                                               fresh_warnings):
    settings.ALLOWED_HOSTS = ["*"]
    with caplog.at_level("WARNING", logger="fastpoll.edge"):
        assert fastpoll.edge_url(RequestFactory().get("/", HTTP_HOST="www.example.com")) == ""   # no edge
        settings.FASTPOLL = dict(fastpoll_settings, **PUBLIC_EDGE)
        assert fastpoll.edge_url(RequestFactory().get("/", HTTP_HOST="www.example.com", secure=True))
    assert not [r for r in caplog.records if r.name == "fastpoll.edge"]


def test_a_page_on_localhost_needs_its_origin_listed(fastpoll_settings, settings, caplog, fresh_warnings):
    """The edge answers only EDGE_ORIGINS (CORS): a page on localhost:PORT is served when
    http://localhost:PORT is listed (then by that name), and the warning says to list it."""
    settings.ALLOWED_HOSTS = ["*"]
    settings.FASTPOLL = dict(fastpoll_settings, EDGE_ADDRESS="127.0.0.1:18302", EDGE_ORIGINS=["http://127.0.0.1:18380"])
    with caplog.at_level("WARNING", logger="fastpoll.edge"):
        assert fastpoll.edge_url(_page("localhost:18380")) == ""
    assert "add 'http://localhost:18380' to EDGE_ORIGINS" in caplog.records[-1].getMessage()
    settings.FASTPOLL = dict(settings.FASTPOLL, EDGE_ORIGINS=["http://127.0.0.1:18380", "http://localhost:18380"])
    assert fastpoll.edge_url(_page("localhost:18380")) == "http://localhost:18302"
    assert fastpoll.edge_url(_page("127.0.0.1:18380")) == "http://127.0.0.1:18302"


def test_a_page_on_another_host_than_a_loopback_edge_is_logged(fastpoll_settings, settings, caplog, fresh_warnings):
    settings.ALLOWED_HOSTS = ["*"]
    settings.FASTPOLL = dict(fastpoll_settings, EDGE_ADDRESS="127.0.0.1:8003", EDGE_ORIGINS=["http://mybox:8000"])
    with caplog.at_level("WARNING", logger="fastpoll.edge"):
        assert fastpoll.edge_url(_page("mybox:8000")) == ""
    [record] = [r for r in caplog.records if r.name == "fastpoll.edge"]
    assert "mybox" in record.getMessage() and "EDGE_URL" in record.getMessage()


# ---- the poll cookie's scope against the edge (E017, E018, W006) ----

def _cookie_findings(fastpoll_settings, settings, session_domain=None, **edge):
    settings.SESSION_COOKIE_DOMAIN = session_domain
    return [(check_id, message) for check_id, message in found(fastpoll_settings, **edge)
            if check_id in ("fastpoll.E017", "fastpoll.E018", "fastpoll.W006")]


@pytest.mark.parametrize("domain", [".com", "com", "localhost"])
def test_a_single_label_cookie_domain_is_refused(fastpoll_settings, settings, domain):
    [(check_id, message)] = _cookie_findings(fastpoll_settings, settings, COOKIE_DOMAIN=domain)
    assert check_id == "fastpoll.E017" and "single label" in message and "\n" not in message


def test_a_single_label_session_cookie_domain_is_refused_for_the_poll_cookie(fastpoll_settings, settings):
    [(check_id, message)] = _cookie_findings(fastpoll_settings, settings, session_domain=".com")
    assert check_id == "fastpoll.E017" and "SESSION_COOKIE_DOMAIN" in message


@pytest.mark.parametrize("cookie_domain, session_domain", [(".example.com", None), ("example.com", None),
                                                           (None, ".example.com")])
def test_a_cookie_domain_over_both_hosts_passes(fastpoll_settings, settings, cookie_domain, session_domain):
    edge = dict(PUBLIC_EDGE, COOKIE_DOMAIN=cookie_domain)
    assert _cookie_findings(fastpoll_settings, settings, session_domain, **edge) == []


def test_a_host_only_cookie_does_not_reach_an_edge_on_another_host(fastpoll_settings, settings):
    [(check_id, message)] = _cookie_findings(fastpoll_settings, settings, **dict(PUBLIC_EDGE, COOKIE_DOMAIN=None))
    assert check_id == "fastpoll.W006"
    assert "www.example.com" in message and "poll.example.com" in message and "host-only" in message
    with override_settings(FASTPOLL=dict(fastpoll_settings, **dict(PUBLIC_EDGE, COOKIE_DOMAIN=None))):
        [error] = [e for e in checks.run_checks(tags=[fastpoll_checks.TAG]) if e.id == "fastpoll.W006"]
    assert "'.example.com'" in error.hint


def test_a_cookie_domain_without_the_edges_host_is_warned_of(fastpoll_settings, settings):
    edge = dict(PUBLIC_EDGE, COOKIE_DOMAIN=".www.example.com")
    [(check_id, message)] = _cookie_findings(fastpoll_settings, settings, **edge)
    assert check_id == "fastpoll.W006" and "'.www.example.com'" in message


def test_a_cross_site_edge_is_warned_of(fastpoll_settings, settings):
    edge = dict(PUBLIC_EDGE, EDGE_URL="https://poll.example.net", COOKIE_DOMAIN=None)
    [(check_id, message)] = _cookie_findings(fastpoll_settings, settings, **edge)
    assert check_id == "fastpoll.W006"
    with override_settings(FASTPOLL=dict(fastpoll_settings, **edge)):
        [warning] = [e for e in checks.run_checks(tags=[fastpoll_checks.TAG]) if e.id == "fastpoll.W006"]
    assert "Bearer" in warning.hint and "fastpoll.js" in warning.hint


def test_a_cookie_domain_that_does_not_cover_a_page_is_an_error(fastpoll_settings, settings):
    edge = dict(PUBLIC_EDGE, EDGE_ORIGINS=[SITE, "https://shop.example.org"])
    [(check_id, message)] = _cookie_findings(fastpoll_settings, settings, **edge)
    assert check_id == "fastpoll.E018" and "https://shop.example.org" in message and "'.example.com'" in message


@pytest.mark.parametrize("origins, domain, expected", [
    # a loopback edge, host-only: pages on its address or on localhost (edge_url() names it so)
    (["http://127.0.0.1:8080", "http://localhost:8080"], None, []),
    # a page on another address is not given a loopback edge at all (edge_url() says so in the
    # log): no cookie has to reach it (the stacks' tests serve pages on 127.0.0.10)
    (["http://127.0.0.2:8080"], None, []),
    # a Domain is dropped on a page on an IP address
    (["http://127.0.0.1:8080"], ".example.com", ["fastpoll.E018"]),
])
def test_cookie_scope_on_a_loopback_edge(fastpoll_settings, settings, origins, domain, expected):
    edge = {"EDGE_ADDRESS": "127.0.0.1:8003", "EDGE_ORIGINS": origins, "COOKIE_DOMAIN": domain}
    assert [i for i, _ in _cookie_findings(fastpoll_settings, settings, **edge)] == expected


def test_no_edge_no_cookie_scope_findings(fastpoll_settings, settings):
    assert _cookie_findings(fastpoll_settings, settings, COOKIE_DOMAIN=".example.com") == []
