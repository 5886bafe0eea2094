"""The client side of op FILL against a fake node speaking ONRAMP section B:
the request must carry the right header, body and credential fd, and replies
(success, -errno, malformed) must be read as the contract says."""

import errno
import os
import shutil
import socket
import struct
import tempfile
import threading
import unittest

from kylix import _node


class FakeNode:
    def __init__(self, path, reply):
        self.reply = reply  # fn(header fields, body, fd) -> bytes datagram
        self.seen = []
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.srv.bind(path)
        self.srv.listen(1)
        self.t = threading.Thread(target=self.serve, daemon=True)
        self.t.start()

    def serve(self):
        c, _ = self.srv.accept()
        with c:
            while True:
                msg, fds, _, _ = socket.recv_fds(c, 1 << 20, 4)
                if not msg:
                    return
                hdr = struct.unpack_from("<IHHII", msg, 0)
                st = [os.fstat(f) for f in fds]
                for f in fds:
                    os.close(f)
                self.seen.append((hdr, msg[16:], st))
                c.send(self.reply(hdr, msg[16:]))

    def close(self):
        self.srv.close()
        self.t.join(5)


def ok_reply(hdr, body, status=0, text=b"", seq_delta=0):
    fields = struct.pack("<QQ32s32s32s", 1234, 5678, b"bounce", b"pread", b"gpu-blake3")
    b = struct.pack("<iI", status, len(text)) + text + (fields if status == 0 else b"")
    return struct.pack("<IHHII", _node.CLIENT_MAGIC, 1, hdr[2] | 0x8000, hdr[3] + seq_delta, len(b)) + b


class NodeClientTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kylix-py-")
        self.addCleanup(shutil.rmtree, self.dir)
        self.sock = os.path.join(self.dir, "n.sock")
        self.file = os.path.join(self.dir, "f")
        with open(self.file, "wb") as f:
            f.write(b"x" * 100)
        self.fd = os.open(self.file, os.O_RDONLY)
        self.addCleanup(os.close, self.fd)

    def serve(self, reply):
        n = FakeNode(self.sock, reply)
        self.addCleanup(n.close)
        c = _node.NodeClient(self.sock)
        self.addCleanup(c.close)
        return n, c

    def test_fill_request_and_reply(self):
        n, c = self.serve(ok_reply)
        h = bytes(range(64))
        r = c.fill(self.fd, 3, h, [(8, 16, 0), (40, 4, 512)], flags=1)
        self.assertEqual((r.bytes, r.nanos, r.path, r.io, r.verified), (1234, 5678, "bounce", "pread", "gpu-blake3"))
        (magic, ver, op, seq, blen), body, st = n.seen[0]
        self.assertEqual((magic, ver, op, blen), (0x4B594C43, 1, 2, len(body)))
        self.assertEqual(len(st), 1)
        self.assertEqual(st[0].st_ino, os.fstat(self.fd).st_ino, "the credential is the file's own fd")
        dev, flags, handle, dst, fo, ln, nr, res = struct.unpack_from("<II64sQQQII", body, 0)
        self.assertEqual((dev, flags, handle, nr, res), (3, 1, h, 2, 0))
        self.assertEqual(struct.calcsize("<II64sQQQII"), 104)
        self.assertEqual(len(body), 104 + 2 * 24)
        self.assertEqual(struct.unpack_from("<QQQQQQ", body, 104), (8, 16, 0, 40, 4, 512))
        c.fill(self.fd, 0, h, [(0, 1, 0)])
        self.assertEqual(n.seen[1][0][3], seq + 1, "seq advances")

    def test_fill_strided(self):
        n, c = self.serve(ok_reply)
        h = bytes(64)
        c.fill(self.fd, 0, h, [(8, 16, 0, 5, 100), (40, 4, 512)])
        _, body, _ = n.seen[0]
        dev, flags, handle, dst, fo, ln, nr, res = struct.unpack_from("<II64sQQQII", body, 0)
        self.assertEqual((flags, nr), (_node.FILL_STRIDED, 2))
        self.assertEqual(len(body), 104 + 2 * 40)
        self.assertEqual(struct.unpack_from("<10Q", body, 104), (8, 16, 0, 5, 100, 40, 4, 512, 1, 0))
        with self.assertRaises(ValueError):
            c.fill(self.fd, 0, h, [(0, 1, 0, 2, 1)] * (_node.MAX_STRIDED_RANGES + 1))

    def test_error_status(self):
        _, c = self.serve(lambda h, b: ok_reply(h, b, status=-errno.ENODEV, text=b"no GPU on this node"))
        with self.assertRaises(_node.NodeError) as cm:
            c.fill(self.fd, 0, bytes(64), [(0, 1, 0)])
        self.assertEqual(cm.exception.errno, errno.ENODEV)
        self.assertIn("no GPU on this node", str(cm.exception))

    def test_mismatched_reply(self):
        _, c = self.serve(lambda h, b: ok_reply(h, b, seq_delta=1))
        with self.assertRaises(_node.NodeError) as cm:
            c.fill(self.fd, 0, bytes(64), [(0, 1, 0)])
        self.assertEqual(cm.exception.errno, errno.EPROTO)

    def test_bad_arguments(self):
        _, c = self.serve(ok_reply)
        with self.assertRaises(ValueError):
            c.fill(self.fd, 0, bytes(63), [(0, 1, 0)])
        with self.assertRaises(ValueError):
            c.fill(self.fd, 0, bytes(64), [])
        with self.assertRaises(ValueError):
            c.fill(self.fd, 0, bytes(64), [(0, 1, 0)] * (_node.MAX_RANGES + 1))

    def test_probe_plain_file(self):
        self.assertIsNone(_node.probe(self.fd))
        self.assertEqual(_node.KYLIX_IOC_PROBE, 0x81004B03)  # _IOR('K', 3, 256)


if __name__ == "__main__":
    unittest.main()
