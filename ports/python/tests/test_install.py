"""Issue 22 item 5: the build backend never produces a package that cannot load its library.

Runs the in-tree PEP 517 backend (ports/python/_backend) in a subprocess, as pip does. Without the
installed library (pkg-config fails) and without cmake, build_wheel must fail with the
instruction, and write no wheel. (.ci/ports.sh also runs `pip install` itself: once with neither,
once with cmake only, which builds the library from this checkout.)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

BACKEND = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_backend")


def build_wheel(env_changes):
    env = dict(os.environ)
    for k in ("PKG_CONFIG_PATH", "KVPRUNE_NO_NATIVE", "CMAKE"):
        env.pop(k, None)
    env.update(env_changes)
    out = tempfile.mkdtemp()
    unittest.addModuleCleanup(shutil.rmtree, out, True)
    code = "import sys, kvprune_backend as b; print(b.build_wheel(sys.argv[1]))"
    r = subprocess.run([sys.executable, "-c", code, out], cwd=BACKEND, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    return r, out


@unittest.skipUnless(os.path.isdir(BACKEND), "no source tree (installed package only)")
class InstallTest(unittest.TestCase):
    def test_no_library_and_no_cmake_fails_with_the_instruction(self):
        r, out = build_wheel({"PKG_CONFIG": "false", "CMAKE": os.path.join(tempfile.gettempdir(), "no-cmake-here")})
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("cannot build the Python package", r.stderr)
        self.assertIn("cmake not found", r.stderr)
        self.assertIn("PKG_CONFIG_PATH=", r.stderr)
        self.assertIn("KVPRUNE_NO_NATIVE=1", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertEqual(os.listdir(out), [], "no wheel may be written")

    def test_pure_package_only_on_request(self):
        r, out = build_wheel({"KVPRUNE_NO_NATIVE": "1", "PKG_CONFIG": "false"})
        self.assertEqual(r.returncode, 0, r.stderr)
        wheel = r.stdout.strip()
        self.assertTrue(wheel.endswith("-py3-none-any.whl"), wheel)
        with zipfile.ZipFile(os.path.join(out, wheel)) as z:
            names = z.namelist()
        self.assertIn("kvprune/__init__.py", names)
        self.assertNotIn("kvprune/libkvprune.so", names)
        self.assertIn("KVPRUNE_LIB", r.stderr)


if __name__ == "__main__":
    unittest.main()
