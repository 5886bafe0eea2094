"""pip installs the package with nothing from an index (issue 23, C.3): the
package is its own PEP 517 backend (build_wheel.py, requires = []), so the
routes contrib/python/README.md documents work offline, as CI is:

  - a venv of /usr/bin/python3 with --system-site-packages, where Debian's
    python3-torch satisfies the torch requirement: pip install DIR, and
    pip install -e DIR;
  - a plain venv: the build works; torch, only a system package, cannot be
    found (pip says so, naming torch), and --no-deps installs the rest.

Before, pip install DIR failed in the build step (setuptools fetched from
the index; without isolation "invalid command 'bdist_wheel'").
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from helpers import needs

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _have(*modules):
    try:
        for m in modules:
            __import__(m)
    except ImportError:
        return False
    return True


@needs(_have("venv", "ensurepip"), "venv with pip for %s (Debian's python3-venv)" % sys.executable)
class PipInstallTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kylix-pip-")
        self.addCleanup(shutil.rmtree, self.dir)

    def pip(self, *args):
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
        env.pop("PYTHONPATH", None)
        return subprocess.run([self.py, "-m", "pip", "install", "--no-index", *args], capture_output=True,
                              text=True, env=env, cwd=self.dir, timeout=300)

    def where(self, module):
        out = subprocess.run([self.py, "-c", "import %s as m; print(m.__file__)" % module], capture_output=True,
                             text=True, cwd=self.dir)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.strip()

    def system_site_packages(self, on):
        """One venv serves as both kinds (creating one takes seconds): the
        flag --system-site-packages sets in pyvenv.cfg, set here."""
        cfg = os.path.join(self.venv, "pyvenv.cfg")
        with open(cfg) as f:
            lines = [l for l in f if not l.startswith("include-system-site-packages")]
        lines.append("include-system-site-packages = %s\n" % ("true" if on else "false"))
        with open(cfg, "w") as f:
            f.writelines(lines)

    @needs(_have("torch"), "torch for %s (Debian's python3-torch)" % sys.executable)
    def test_pip_install_offline(self):
        self.venv = os.path.join(self.dir, "venv")
        subprocess.run([sys.executable, "-m", "venv", self.venv], check=True, capture_output=True)
        self.py = os.path.join(self.venv, "bin", "python")

        # A plain venv: the build needs nothing; only torch cannot be found.
        r = self.pip(ROOT)
        self.assertNotEqual(r.returncode, 0)
        self.assertNotIn("bdist_wheel", r.stdout + r.stderr)
        self.assertIn("requirement torch", r.stdout + r.stderr, "the build worked; only torch is missing")
        r = self.pip("--no-deps", ROOT)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(self.where("kylix.safetensors").startswith(self.dir))

        # With the system's site packages: Debian's torch satisfies it.
        self.system_site_packages(True)
        subprocess.run([self.py, "-m", "pip", "uninstall", "-y", "-q", "kylix"], check=True, capture_output=True)
        r = self.pip(ROOT)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("Successfully installed kylix-", r.stdout)
        where = self.where("kylix.torch")
        self.assertTrue(where.startswith(self.dir), where)
        # Editable: imported from the source tree.
        r = self.pip("--force-reinstall", "--no-deps", "-e", ROOT)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(self.where("kylix"), os.path.join(ROOT, "kylix", "__init__.py"))


if __name__ == "__main__":
    unittest.main()
