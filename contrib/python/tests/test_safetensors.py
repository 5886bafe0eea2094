import os
import shutil
import struct
import tempfile
import unittest

from kylix.safetensors import SafetensorError, parse_file

from helpers import raw_header, write_st


class ParseTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kylix-py-")
        self.addCleanup(shutil.rmtree, self.dir)
        self.p = os.path.join(self.dir, "x.safetensors")

    def bad(self, js: bytes, data: bytes = b"", want: str = ""):
        raw_header(self.p, js, data)
        with self.assertRaises(SafetensorError) as cm:
            parse_file(self.p)
        self.assertIn(want, str(cm.exception))

    def test_good(self):
        write_st(self.p, [("b", "F32", (2, 2), bytes(16)), ("a", "BF16", (3,), bytes(6)),
                          ("z", "U8", (0,), b"")], metadata={"format": "pt"})
        h = parse_file(self.p)
        self.assertEqual(h.metadata, {"format": "pt"})
        self.assertEqual(list(h.tensors), ["b", "a", "z"])  # file order
        a = h.tensors["a"]
        self.assertEqual((a.dtype, a.shape, a.nbytes, a.offset), ("BF16", (3,), 6, h.data_start + 16))

    def test_scalar_and_empty_file(self):
        write_st(self.p, [("s", "F64", (), bytes(8))])
        self.assertEqual(parse_file(self.p).tensors["s"].shape, ())
        write_st(self.p, [])
        self.assertEqual(parse_file(self.p).tensors, {})

    def test_header_length(self):
        with open(self.p, "wb") as f:
            f.write(b"\x01\x00")
        with self.assertRaisesRegex(SafetensorError, "shorter than"):
            parse_file(self.p)
        with open(self.p, "wb") as f:
            f.write(struct.pack("<Q", 0))
        with self.assertRaisesRegex(SafetensorError, "is 0"):
            parse_file(self.p)
        with open(self.p, "wb") as f:
            f.write(struct.pack("<Q", 200_000_000) + b"{}")
        with self.assertRaisesRegex(SafetensorError, "limit"):
            parse_file(self.p)
        with open(self.p, "wb") as f:
            f.write(struct.pack("<Q", 100) + b"{}")
        with self.assertRaisesRegex(SafetensorError, "past the end"):
            parse_file(self.p)

    def test_rejections(self):
        t = b'"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
        self.bad(b" {}", want="start with")
        self.bad(b"{\xff}", want="UTF-8")
        self.bad(b"{", want="JSON")
        self.bad(b"{" + t + b"," + t + b"}", bytes(8), want="duplicate")
        self.bad(b'{"t":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}}', bytes(8), want="dtype")
        self.bad(b'{"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', bytes(8), want="needs 12")
        self.bad(b'{"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', bytes(8), want="shape")
        self.bad(b'{"t":{"dtype":"F32","shape":[true],"data_offsets":[0,1]}}', bytes(1), want="shape")
        self.bad(b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', bytes(8), want="end before")
        self.bad(b'{"t":{"dtype":"F32","shape":[2]}}', bytes(8), want="missing")
        self.bad(b'{"__metadata__":{"a":1}}', want="__metadata__")
        self.bad(b"[" * 100000 + b"]" * 100000, want="")  # nesting bomb: error, not a crash
        # Gap, overlap, and data past the last tensor: all refused as safetensors does.
        self.bad(b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12), want="expected 0")
        self.bad(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                 b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', bytes(12), want="expected 8")
        self.bad(b"{" + t + b"}", bytes(9), want="data section is 9")
        self.bad(b"{" + t + b"}", bytes(7), want="data section is 7")

    def test_unknown_tensor_field_ignored(self):
        raw_header(self.p, b'{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}', bytes(8))
        self.assertEqual(parse_file(self.p).tensors["t"].shape, (2,))

    def test_huge_shape_no_overflow(self):
        self.bad(b'{"t":{"dtype":"F64","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}',
                 bytes(8), want="needs")


    def test_mutations_fail_cleanly(self):
        # Bounded random mutations of a valid file: the parser either accepts
        # a header whose tensors tile the file, or raises SafetensorError;
        # never another exception.
        import random
        from kylix.safetensors import parse_bytes
        write_st(self.p, [("a", "F32", (2, 3), bytes(24)), ("b", "BF16", (5,), bytes(10))],
                 metadata={"format": "pt"})
        with open(self.p, "rb") as f:
            good = f.read()
        rng = random.Random(8)
        alphabet = b'{}[]",:0123456789-eE.tfnul \\x\xff\x00'
        accepted = 0
        for _ in range(3000):
            b = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(b))
                op = rng.random()
                if op < 0.5:
                    b[i] = rng.choice(alphabet)
                elif op < 0.75:
                    del b[i]
                else:
                    b.insert(i, rng.choice(alphabet))
            try:
                h = parse_bytes(bytes(b), len(b))
            except SafetensorError:
                continue
            accepted += 1
            end = max((t.end for t in h.tensors.values()), default=0)
            self.assertEqual(h.data_start + end, len(b))
        self.assertLess(accepted, 3000)


if __name__ == "__main__":
    unittest.main()
