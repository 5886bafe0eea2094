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


def load_with_fake_base(test, module_file, fake_modules):
    """Loads kylix/<module_file> afresh (as kylix.<name>_on_fake_base) while
    sys.modules holds fake_modules ({dotted name: module}), standing in for
    an engine that is not installed, so the engine-facing class is built on
    the fake's base class; the fakes are removed at cleanup."""
    import importlib.util
    import sys
    import types
    import kylix
    for name in fake_modules:
        parts = name.split(".")
        for i in range(1, len(parts)):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    added = [n for n in sys.modules if n.split(".")[0] in {m.split(".")[0] for m in fake_modules}]
    sys.modules.update(fake_modules)
    path = os.path.join(os.path.dirname(kylix.__file__), module_file)
    name = "kylix." + module_file[:-3] + "_on_fake_base"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)

    def cleanup():
        for n in set(added) | set(fake_modules):
            sys.modules.pop(n, None)
        sys.modules.pop(name, None)
    test.addCleanup(cleanup)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
