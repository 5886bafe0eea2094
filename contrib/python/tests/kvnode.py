"""A kylix serve with a KV store, for the KV adapters' tests
(test_kv_vllm.py, test_kv_lmcache.py): started once per class the way
test_kv.KVTest starts its own (the same code), with the class's
NODE_ARGS; each test gets a KVStore on it (self.kv), cleared first."""

import os
import shutil
import tempfile
import unittest

import test_kv
from kylix import kv as kkv


class KVNodeCase(unittest.TestCase):
    NODE_ARGS = ()

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kylix-py-kvnode-")
        cls.data, cls.mnt = os.path.join(cls.tmp, "data"), os.path.join(cls.tmp, "mnt")
        os.makedirs(cls.data)
        os.makedirs(cls.mnt)
        try:
            test_kv.KVTest.start.__func__(cls, *cls.NODE_ARGS)
        except BaseException:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        test_kv.KVTest.stop.__func__(cls)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.kv = kkv.KVStore(self.mnt)
        self.addCleanup(self.kv.close)
        self.kv.clear()
