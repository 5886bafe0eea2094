import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
import build_wheel  # noqa: E402

from helpers import write_st  # noqa: E402


class WheelTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kylix-py-")
        self.addCleanup(shutil.rmtree, self.dir)

    def check(self, whl, want_lib):
        with zipfile.ZipFile(whl) as z:
            names = z.namelist()
            self.assertIn("kylix/torch.py", names)
            self.assertEqual("kylix/libkylix.so" in names, want_lib)
            di = [n for n in names if n.endswith(".dist-info/RECORD")][0].rsplit("/", 1)[0]
            rec = z.read(f"{di}/RECORD").decode().splitlines()
            self.assertEqual(len(rec), len(names))
            for line in rec:
                path, h, size = line.rsplit(",", 2)
                if path.endswith("RECORD"):
                    continue
                data = z.read(path)
                want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                self.assertEqual((h, int(size)), (want, len(data)), path)
            self.assertIn("[vllm.general_plugins]\nkylix = kylix.vllm:register", z.read(f"{di}/entry_points.txt").decode())
            self.assertIn("Tag: py3-none-" + ("linux_" if want_lib else "any"), z.read(f"{di}/WHEEL").decode())
            z.extractall(os.path.join(self.dir, "site"))

    def test_pure_wheel_installs_and_loads(self):
        whl = build_wheel.build(self.dir, None)
        self.check(whl, False)
        again = build_wheel.build(os.path.join(self.dir, "b"), None)
        with open(whl, "rb") as a, open(again, "rb") as b:
            self.assertEqual(a.read(), b.read(), "reproducible")
        p = os.path.join(self.dir, "t.safetensors")
        write_st(p, [("x", "U8", (3,), b"abc")])
        code = ("import kylix, kylix.torch as kt; assert kylix.__file__.startswith(%r), kylix.__file__;"
                "print(bytes(kt.load_file(%r)['x'].tolist()).decode())") % (os.path.join(self.dir, "site"), p)
        out = subprocess.run([sys.executable, "-c", code], cwd=self.dir, check=True, capture_output=True,
                             env={**os.environ, "PYTHONPATH": os.path.join(self.dir, "site")}, text=True)
        self.assertEqual(out.stdout.strip(), "abc")

    def test_lib_goes_inside(self):
        fake = os.path.join(self.dir, "libkylix.so")
        with open(fake, "wb") as f:
            f.write(b"\x7fELF not really")
        self.check(build_wheel.build(self.dir, fake), True)


if __name__ == "__main__":
    unittest.main()
