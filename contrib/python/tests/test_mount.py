"""kylix.torch through a live Kylix mount (bin/kylix serve, as root: /dev/fuse):
a model imported into the node, loaded from the mount, whole and per TP rank,
equal to the files it was imported from."""

import errno
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import torch

import kylix.torch as kt
from kylix import _node, split as ksplit

from helpers import KYLIX_BIN, demo_model, needs, numpy_parse, shards, tbytes


def serve_help():
    r = subprocess.run([KYLIX_BIN, "serve", "--help"], capture_output=True, text=True)
    return r.stdout + r.stderr


@unittest.skipUnless(os.geteuid() == 0, "needs root (kylix serve mounts with FUSE); CI runs it as root")
@needs(os.path.exists("/dev/fuse") and os.path.exists(KYLIX_BIN), "/dev/fuse (fuse3) and bin/kylix (make build)")
class MountTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kylix-py-")
        cls.data, cls.mnt = os.path.join(cls.tmp, "data"), os.path.join(cls.tmp, "mnt")
        os.makedirs(cls.data)
        os.makedirs(cls.mnt)
        cls.log = open(os.path.join(cls.tmp, "serve.log"), "w+")
        args = [KYLIX_BIN, "serve", "--data", cls.data, "--mount", cls.mnt]
        cls.client_sock = None
        if "client-socket" in serve_help():  # a node with the client socket (issue 8)
            cls.client_sock = os.path.join(cls.tmp, "client.sock")
            args += ["--client-socket", cls.client_sock]
        cls.node = subprocess.Popen(args, stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        # Poll the mount itself: `kylix node` before the node holds the store
        # would open (and lock) the store and make serve fail.
        while not (os.path.ismount(cls.mnt) and os.path.exists(os.path.join(cls.data, "kylix.sock"))):
            if cls.node.poll() is not None or time.monotonic() > deadline:
                cls.log.seek(0)
                out = cls.log.read()[-2000:]
                cls.tearDownClass()
                raise AssertionError("kylix serve did not come up: " + out)
            time.sleep(0.05)
        cls.src = demo_model("24MiB", seed=3)
        subprocess.run([KYLIX_BIN, "import", "--data", cls.data, os.path.join(cls.src, "base"), "models/m"],
                       check=True, capture_output=True)

    @classmethod
    def tearDownClass(cls):
        if cls.node.poll() is None:
            cls.node.send_signal(signal.SIGTERM)
            try:
                cls.node.wait(30)
            except subprocess.TimeoutExpired:
                cls.node.kill()
                cls.node.wait()
        cls.log.close()
        if os.path.ismount(cls.mnt):
            subprocess.run(["fusermount3", "-u", cls.mnt], capture_output=True)
            subprocess.run(["umount", "-l", cls.mnt], capture_output=True)
        shutil.rmtree(cls.tmp, ignore_errors=True)
        if hasattr(cls, "src"):
            shutil.rmtree(cls.src, ignore_errors=True)

    def test_load_from_mount(self):
        for orig in shards(self.src):
            p = os.path.join(self.mnt, "models", "m", os.path.basename(orig))
            got = kt.load_file(p)
            ref = numpy_parse(orig)
            self.assertEqual(sorted(ref), list(got))
            for k, (_dt, shape, raw) in ref.items():
                self.assertEqual(tuple(got[k].shape), shape)
                self.assertTrue(tbytes(got[k]) == raw, k)
            for rank in range(2):
                part = kt.load_file(p, tp_rank=rank, tp_size=2)
                for k, t in got.items():
                    dim = ksplit.split_dim(k, t.dim())
                    want = t if dim is None else t.chunk(2, dim)[rank]
                    self.assertTrue(tbytes(part[k]) == tbytes(want), (k, rank))
            with kt.safe_open(p, "pt") as f:
                k = f.keys()[0]
                self.assertTrue(tbytes(f.get_slice(k)[1:3]) == tbytes(got[k][1:3]))

    def test_probe(self):
        # On a node with KYLIX_IOC_PROBE (issue 8) the probe names the node;
        # on one without it, the file is simply "not known to be Kylix".
        p = shards(self.src)[0]
        fd = os.open(os.path.join(self.mnt, "models", "m", os.path.basename(p)), os.O_RDONLY)
        try:
            pr = _node.probe(fd)
        finally:
            os.close(fd)
        if pr is not None:
            self.assertEqual(pr[1], self.node.pid)
        fd = os.open(p, os.O_RDONLY)
        try:
            self.assertIsNone(_node.probe(fd))
        finally:
            os.close(fd)


    def test_fill_through_real_node(self):
        # The node's op FILL with our client: on a machine without a GPU the
        # node answers -ENODEV with its reason; with one, a bogus IPC handle
        # is refused. Either way the request was parsed and the fd accepted
        # as a credential (a malformed request would be EINVAL/EPROTO).
        if self.client_sock is None:
            self.skipTest("this node has no client socket")
        p = os.path.join(self.mnt, "models", "m", os.path.basename(shards(self.src)[0]))
        fd = os.open(p, os.O_RDONLY)
        c = _node.NodeClient(self.client_sock)
        try:
            with self.assertRaises(_node.NodeError) as cm:
                c.fill(fd, 0, bytes(64), [(0, 4096, 0)])
        finally:
            c.close()
            os.close(fd)
        msg = str(cm.exception)
        self.assertIn("node: ", msg)  # the node's own message, for humans
        if cm.exception.errno == errno.EINVAL:
            # With a GPU the request gets as far as the handle, and the
            # bogus handle itself is refused (seen on the H200).
            self.assertIn("IPC handle", msg)
        else:
            self.assertNotIn(cm.exception.errno, (errno.EPROTO, errno.EBADF, errno.EPERM), msg)

    def test_cuda_request_falls_back_without_gpu(self):
        # device="cuda" on a machine without CUDA: the node path is tried
        # only with a GPU here; torch then says there is no CUDA.
        if torch.cuda.is_available():
            self.skipTest("has a GPU")
        p = os.path.join(self.mnt, "models", "m", os.path.basename(shards(self.src)[0]))
        with self.assertRaises((RuntimeError, AssertionError)):
            kt.load_file(p, device="cuda:0")


if __name__ == "__main__":
    unittest.main()
