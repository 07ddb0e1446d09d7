"""A minimal PEP 517 build backend for the kvprune Python package (standard library only).

build_wheel puts the package kvprune/ and kvprune/libkvprune.so (linked from libkvprune.a) into a
platform wheel. The static library comes from, first match wins:
  1. the installed library: `pkg-config --static --libs kvprune` (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig);
  2. this source tree, built with cmake (`CMAKE` names the binary, default `cmake` on PATH) into
     <repo>/build-python (KVPRUNE_BUILD_DIR overrides; a second install reuses it);
  3. neither: the build fails with the instruction (it never installs a package that cannot load).
KVPRUNE_NO_NATIVE=1 builds a pure package on purpose (the library is then found at run time through
KVPRUNE_LIB). No network, no setuptools: `requires = []`.
"""
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

NAME, VERSION = "kvprune", "0.2.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository, when building from a checkout


def _metadata():
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: ctypes bindings to kvprune, an "
            "arena-backed pruning KV cache (C ABI)\nRequires-Python: >=3.8\nLicense: MIT\n" % (NAME, VERSION))


INSTRUCTION = """kvprune: cannot build the Python package: the C library libkvprune.a is not installed where
pkg-config finds it, and it cannot be built here ({why}).
Do one of:
  * build and install the library, then point pkg-config at it:
        cmake -S {root} -B build -DCMAKE_BUILD_TYPE=Release -DKVP_BUILD_TESTS=OFF -DKVP_BUILD_BENCH=OFF
        cmake --build build -j2 --target kvprune && cmake --install build --prefix "$PWD/_install"
        PKG_CONFIG_PATH="$PWD/_install/lib/pkgconfig" pip install --no-index ./ports/python
  * install cmake and a C++17 compiler (Debian: cmake g++ libsimde-dev) and run pip install again from
    the kvprune checkout: the library is then built from source (into build-python/);
  * or KVPRUNE_NO_NATIVE=1 pip install ... for a package without the library, and set
    KVPRUNE_LIB=<path of libkvprune.so> at run time.
(pkg-config: {pc})"""


class BuildError(RuntimeError):
    pass


def _run(cmd, log):
    with open(log, "ab") as f:
        f.write(("$ %s\n" % " ".join(cmd)).encode())
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(log, "rb") as f:
            tail = f.read()[-4000:].decode("utf-8", "replace")
        raise BuildError("`%s` failed (exit %d); the end of %s:\n%s" % (" ".join(cmd), r.returncode, log, tail))


def _cmake_build(kvprune):
    """Builds libkvprune.a from ROOT with cmake; returns (static_lib, libs). BuildError if it cannot."""
    if not (os.path.isfile(os.path.join(ROOT, "CMakeLists.txt"))
            and os.path.isfile(os.path.join(ROOT, "include", "kvprune", "kvprune.h"))):
        raise BuildError("no kvprune source tree around %s" % HERE)
    cmake = os.environ.get("CMAKE") or shutil.which("cmake")
    if not cmake or not (os.path.isfile(cmake) and os.access(cmake, os.X_OK)):
        raise BuildError("cmake not found%s" % (" (CMAKE=%s)" % os.environ["CMAKE"] if os.environ.get("CMAKE") else
                                                " on PATH"))
    build = os.environ.get("KVPRUNE_BUILD_DIR") or os.path.join(ROOT, "build-python")
    os.makedirs(build, exist_ok=True)
    prefix = os.path.join(build, "_prefix")
    log = os.path.join(build, "pip-build.log")
    sys.stderr.write("kvprune: building libkvprune.a with %s in %s (log: %s)\n" % (cmake, build, log))
    _run([cmake, "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DKVP_BUILD_TESTS=OFF",
          "-DKVP_BUILD_BENCH=OFF", "-DCMAKE_INSTALL_PREFIX=" + prefix], log)
    jobs = [] if os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") else ["-j", str(os.cpu_count() or 1)]
    _run([cmake, "--build", build, "--target", "kvprune"] + jobs, log)
    _run([cmake, "--install", build], log)
    libdir = next((os.path.join(prefix, d) for d in ("lib", "lib64")
                   if os.path.isfile(os.path.join(prefix, d, "libkvprune.a"))), None)
    if libdir is None:
        raise BuildError("cmake --install left no libkvprune.a under %s" % prefix)
    # The link flags pkg-config would give (Libs of kvprune.pc), read without pkg-config.
    libs = ["-lstdc++", "-lm", "-pthread"]
    pc = os.path.join(libdir, "pkgconfig", "kvprune.pc")
    if os.path.isfile(pc):
        with open(pc) as f:
            for line in f:
                if line.startswith("Libs:") or line.startswith("Libs.private:"):
                    flags = line.split(":", 1)[1].split()
                    libs = [x for x in flags if x != "-lkvprune" and not x.startswith("-L")] or libs
                    break
    return os.path.join(libdir, "libkvprune.a"), libs


def _native_lib(tmp):
    if os.environ.get("KVPRUNE_NO_NATIVE") == "1":
        sys.stderr.write("kvprune: KVPRUNE_NO_NATIVE=1: no shared library bundled; set KVPRUNE_LIB at run time\n")
        return None
    sys.path.insert(0, HERE)
    try:
        import kvprune  # the package's own build_shared_library (pkg-config + c++)
        dest = os.path.join(tmp, "libkvprune.so")
        try:
            kvprune.build_shared_library(dest)
            return dest
        except (OSError, subprocess.CalledProcessError) as e:
            pc_error = str(e).strip() or type(e).__name__
        try:
            static_lib, libs = _cmake_build(kvprune)
            kvprune.build_shared_library(dest, static_lib=static_lib, libs=libs)
            return dest
        except (BuildError, OSError, subprocess.CalledProcessError) as e:
            raise BuildError(INSTRUCTION.format(why=str(e).strip(), root=ROOT, pc=pc_error)) from None
    finally:
        sys.path.pop(0)
        sys.modules.pop("kvprune", None)


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, "%s-%s.dist-info" % (NAME, VERSION))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(_metadata())
    return os.path.basename(d)


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, digest, len(data))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with tempfile.TemporaryDirectory() as tmp:
        try:
            so = _native_lib(tmp)
        except BuildError as e:  # the instruction, without a traceback around it
            sys.stderr.write("\n%s\n\n" % e)
            raise SystemExit(1)
        tag = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_") if so else "py3-none-any"
        wheel_name = "%s-%s-%s.whl" % (NAME, VERSION, tag)
        files = []
        pkg = os.path.join(HERE, "kvprune")
        for fn in sorted(os.listdir(pkg)):
            if fn.endswith(".py"):
                with open(os.path.join(pkg, fn), "rb") as f:
                    files.append(("kvprune/" + fn, f.read()))
        if so:
            with open(so, "rb") as f:
                files.append(("kvprune/libkvprune.so", f.read()))
        info = "%s-%s.dist-info" % (NAME, VERSION)
        files.append((info + "/METADATA", _metadata().encode()))
        files.append((info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: kvprune_backend\nRoot-Is-Purelib: %s\nTag: %s\n"
                                        % ("false" if so else "true", tag)).encode()))
        record = [_record_line(a, d) for a, d in files] + [info + "/RECORD,,"]
        files.append((info + "/RECORD", ("\n".join(record) + "\n").encode()))
        path = os.path.join(wheel_directory, wheel_name)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for arc, data in files:
                zi = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
                zi.external_attr = (0o755 if arc.endswith(".so") else 0o644) << 16
                z.writestr(zi, data, zipfile.ZIP_DEFLATED)
        return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    name = "%s-%s" % (NAME, VERSION)
    path = os.path.join(sdist_directory, name + ".tar.gz")
    with tarfile.open(path, "w:gz") as t:
        for rel in ("pyproject.toml", "kvprune/__init__.py", "_backend/kvprune_backend.py"):
            t.add(os.path.join(HERE, rel), arcname=name + "/" + rel)
        pkg_info = os.path.join(sdist_directory, "PKG-INFO.tmp")
        with open(pkg_info, "w") as f:
            f.write(_metadata())
        t.add(pkg_info, arcname=name + "/PKG-INFO")
        os.remove(pkg_info)
    return os.path.basename(path)
