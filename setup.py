"""The fastpath C extension of the ``fastpoll`` distribution (libevent + libcrypto + llhttp).

The metadata and the package list are in pyproject.toml.  ``pip install .`` (or of the sdist)
compiles fastpath from its .pyx and C sources; ``make install`` builds it in place for the tree.
Set FASTPATH_DEBUG=1 for -O0 -g and debug checks, or FASTPATH_SANITIZE=address for an
AddressSanitizer build.
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

# What the build takes from the system, each checked before anything is compiled: name ->
# (what the line says is not found, the Debian package that provides it, "it"/"them").  A missing
# one ends the build with missing()'s one line; libevent and libcrypto are found by pkg-config.
SYSTEM_REQUIREMENTS = {
    "compiler": ("C compiler", "gcc", "it"),
    "Python.h": ("Python.h", "python3-dev", "it"),
    "pkg-config": ("pkg-config", "pkg-config", "it"),
    "llhttp": ("llhttp sources", "node-llhttp", "them"),
    "libevent": ("libevent headers", "libevent-dev", "them"),
    "libcrypto": ("libcrypto headers", "libssl-dev", "them"),
}
NATIVE_DEPENDENCIES = ("libevent", "libcrypto")


def missing(name, detail=""):
    """Stop the build: ``error: <what><detail> not found; install it with: apt-get install <package>``."""
    what, package, pronoun = SYSTEM_REQUIREMENTS[name]
    sys.exit(f"error: {what}{detail} not found; install {pronoun} with: apt-get install {package}")


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        missing("pkg-config")
    except subprocess.CalledProcessError:
        return None
    return shlex.split(out)


# llhttp (the HTTP parser of Node.js) is not a shared library on Debian: the node-llhttp
# package ships its C sources, which we compile into the extension.  LLHTTP_DIR overrides.
LLHTTP_DEBIAN = ("/usr/share/llhttp", "/usr/share/include/llhttp")
LLHTTP_SOURCES = ("llhttp.c", "api.c", "http.c")


def llhttp_paths():
    src_dir, inc_dir = (os.environ["LLHTTP_DIR"],) * 2 if os.environ.get("LLHTTP_DIR") else LLHTTP_DEBIAN
    sources = [os.path.join(src_dir, name) for name in LLHTTP_SOURCES]
    if not os.path.exists(os.path.join(inc_dir, "llhttp.h")) or not all(map(os.path.exists, sources)):
        missing("llhttp")
    return sources, inc_dir


class FastpathBuildExt(build_ext):
    """Cythonizes, finds libevent, libcrypto and llhttp, and fails with one line naming the package.

    Cython runs here rather than when setup.py is read, so that making the sdist neither needs
    Cython nor writes generated C into the tree."""

    def build_extensions(self):
        # the system's part first: a missing package is said before Cython spends seconds
        self._check_compiler_and_python_h()
        for ext in self.extensions:
            if ext.name == "fastpath._server":
                self._add_native_dependencies(ext)
        try:
            from Cython.Build import cythonize
        except ImportError:
            sys.exit("error: Cython not found; install it with: pip install 'Cython>=3.0' "
                     "(pip install of the sdist brings it itself)")
        # the .pyx sources become .c; the Extension objects stay those setuptools has prepared
        generated = {ext.name: ext for ext in cythonize(self.extensions, language_level=3,
                                                        compiler_directives={"embedsignature": True})}
        for ext in self.extensions:
            ext.sources = generated[ext.name].sources
            if os.environ.get("FASTPATH_DEBUG") == "1":
                ext.extra_compile_args += ["-O0", "-g", "-DFASTPATH_DEBUG=1"]
            sanitizer = os.environ.get("FASTPATH_SANITIZE")
            if sanitizer:
                ext.extra_compile_args += [f"-fsanitize={sanitizer}", "-fno-omit-frame-pointer", "-g"]
                if "undefined" in sanitizer:  # a report stops the worker, so tests see it
                    ext.extra_compile_args.append("-fno-sanitize-recover=undefined")
                ext.extra_link_args += [f"-fsanitize={sanitizer}"]
        super().build_extensions()

    def _check_compiler_and_python_h(self):
        """The compiler and the Python.h this build would use (setuptools' own choice: CC, else
        Python's sysconfig CC; the include directories it gives the compiler), not a guess."""
        compiler = getattr(self.compiler, "compiler_so", None)
        if compiler:                  # a unix compiler: the command it runs, CC's first word
            if shutil.which(compiler[0]) is None and os.environ.get("CC"):
                sys.exit(f"error: C compiler {compiler[0]} (from CC) not found; set CC to an installed "
                         f"compiler, or unset it")
            if shutil.which(compiler[0]) is None:
                missing("compiler", f" {compiler[0]}")
        include_dirs = self.include_dirs or [sysconfig.get_path("include")]
        if not any(os.path.isfile(os.path.join(d, "Python.h")) for d in include_dirs):
            missing("Python.h", f" in {sysconfig.get_path('include')}")

    @staticmethod
    def _add_native_dependencies(ext):
        llhttp_sources, llhttp_include = llhttp_paths()
        ext.sources += [s for s in llhttp_sources if s not in ext.sources]
        ext.include_dirs.append(llhttp_include)
        for module in NATIVE_DEPENDENCIES:
            flags = pkg_config("--cflags", "--libs", module)
            if flags is None:
                missing(module)
            for flag in flags:
                if flag.startswith("-I"):
                    ext.include_dirs.append(flag[2:])
                elif flag.startswith("-l"):
                    ext.libraries.append(flag[2:])
                elif flag.startswith("-L"):
                    ext.library_dirs.append(flag[2:])


def fastpath_extensions():
    # relative paths: setuptools wants them, and the sdist's build runs in its own root
    sources = ["fastpath/_server.pyx"] + sorted(
        os.path.join("fastpath", "src", name)
        for name in os.listdir(os.path.join(HERE, "fastpath", "src"))
        if name.endswith(".c")
    )
    server = Extension(
        "fastpath._server",
        sources=sources,
        include_dirs=["fastpath/src", "fastpath/includes"],
        extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-std=gnu11"],
    )
    # configuration and lifecycle (options, sockets, the worker supervisor): no C sources of its own
    lifecycle = Extension("fastpath._lifecycle", sources=["fastpath/_lifecycle.pyx"],
                          extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"])
    return [server, lifecycle]


setup(
    ext_modules=fastpath_extensions(),
    cmdclass={"build_ext": FastpathBuildExt},
)
