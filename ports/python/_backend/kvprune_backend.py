"""A minimal PEP 517 build backend for the kvprune Python package (standard library only).

build_wheel: the package kvprune/ plus, when `pkg-config --static --libs kvprune` finds the
installed library, kvprune/libkvprune.so linked from libkvprune.a (then the wheel is tagged for
this platform). KVPRUNE_NO_NATIVE=1 skips the shared object. No network, no setuptools.
"""
import base64
import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

NAME, VERSION = "kvprune", "0.2.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _metadata():
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: ctypes bindings to kvprune, an "
            "arena-backed pruning KV cache (C ABI)\nRequires-Python: >=3.8\nLicense: MIT\n" % (NAME, VERSION))


def _native_lib(tmp):
    if os.environ.get("KVPRUNE_NO_NATIVE") == "1":
        return None
    sys.path.insert(0, HERE)
    try:
        import kvprune  # the package's own build_shared_library (pkg-config + c++)
        dest = os.path.join(tmp, "libkvprune.so")
        try:
            kvprune.build_shared_library(dest)
        except (OSError, subprocess.CalledProcessError) as e:
            sys.stderr.write("kvprune: no shared library bundled (%s); set KVPRUNE_LIB at run time\n" % e)
            return None
        return dest
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
        so = _native_lib(tmp)
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
