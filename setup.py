"""Builds plurkcore, plurksite, plurkweb and the fastpath C extension (libevent + libcrypto).

``pip install .`` compiles fastpath; set FASTPATH_DEBUG=1 for -O0 -g and debug checks, or
FASTPATH_SANITIZE=address for an AddressSanitizer build.
"""
import os
import shlex
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))

# pkg-config name -> the Debian package that provides its headers
NATIVE_DEPENDENCIES = {
    "libevent": "libevent-dev",
    "libcrypto": "libssl-dev",
}


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit("error: pkg-config not found; install it with: apt-get install pkg-config")
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
        sys.exit("error: llhttp sources not found; install them with: apt-get install node-llhttp")
    return sources, inc_dir


class FastpathBuildExt(build_ext):
    """Finds libevent, libcrypto and llhttp and fails with one line naming the package."""

    def build_extensions(self):
        for ext in self.extensions:
            if ext.name == "fastpath._server":
                self._add_native_dependencies(ext)
            if os.environ.get("FASTPATH_DEBUG") == "1":
                ext.extra_compile_args += ["-O0", "-g", "-DFASTPATH_DEBUG=1"]
            sanitizer = os.environ.get("FASTPATH_SANITIZE")
            if sanitizer:
                ext.extra_compile_args += [f"-fsanitize={sanitizer}", "-fno-omit-frame-pointer", "-g"]
                if "undefined" in sanitizer:  # a report stops the worker, so tests see it
                    ext.extra_compile_args.append("-fno-sanitize-recover=undefined")
                ext.extra_link_args += [f"-fsanitize={sanitizer}"]
        super().build_extensions()

    @staticmethod
    def _add_native_dependencies(ext):
        llhttp_sources, llhttp_include = llhttp_paths()
        ext.sources += [s for s in llhttp_sources if s not in ext.sources]
        ext.include_dirs.append(llhttp_include)
        for module, debian_package in NATIVE_DEPENDENCIES.items():
            flags = pkg_config("--cflags", "--libs", module)
            if flags is None:
                sys.exit(f"error: {module} headers not found; install them with: "
                         f"apt-get install {debian_package}")
            for flag in flags:
                if flag.startswith("-I"):
                    ext.include_dirs.append(flag[2:])
                elif flag.startswith("-l"):
                    ext.libraries.append(flag[2:])
                elif flag.startswith("-L"):
                    ext.library_dirs.append(flag[2:])


def fastpath_extension():
    from Cython.Build import cythonize

    sources = ["fastpath/_server.pyx"] + sorted(
        os.path.join("fastpath", "src", name)
        for name in os.listdir(os.path.join(HERE, "fastpath", "src"))
        if name.endswith(".c")
    )
    ext = Extension(
        "fastpath._server",
        sources=sources,
        include_dirs=["fastpath/src", "fastpath/includes"],
        extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-std=gnu11"],
    )
    # configuration and lifecycle (options, sockets, the worker supervisor): no C sources of its own
    lifecycle = Extension("fastpath._lifecycle", sources=["fastpath/_lifecycle.pyx"],
                          extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"])
    return cythonize([ext, lifecycle], language_level=3, compiler_directives={"embedsignature": True})


def read_version():
    ns = {}
    with open(os.path.join(HERE, "fastpoll", "_version.py")) as fh:
        exec(fh.read(), ns)
    return ns["__version__"]


setup(
    name="plurk-fastpoll",
    version=read_version(),
    description="Plurk-style fast polling: Django store + libevent/memcached fast path behind nginx",
    packages=find_packages(include=["plurkcore*", "plurksite*", "plurkweb*", "fastpath*", "locustfiles*"]),
    include_package_data=True,
    package_data={
        "plurkcore": ["templates/**/*", "static/**/*"],
        "plurkweb": ["templates/**/*", "static/**/*"],
        "fastpath": ["*.pyi", "*.pxd", "py.typed"],
    },
    exclude_package_data={"fastpath": ["*.c"]},
    ext_modules=fastpath_extension(),
    cmdclass={"build_ext": FastpathBuildExt},
    python_requires=">=3.10",
    install_requires=["Django>=4.2,<6", "pymemcache>=4,<5", "gunicorn>=21"],
    extras_require={"postgres": ["psycopg[binary]>=3.1"]},
)
