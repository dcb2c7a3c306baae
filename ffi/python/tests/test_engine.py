"""Tests of kvcm.Engine against a real server (the embedded file storage), run by
ffi/tests/python.rs with the same KVCM_TEST_* variables as test_client.py."""

import os
import tempfile
import unittest

ENV = os.environ
if not ENV.get("KVCM_TEST_GRPC"):
    raise RuntimeError("run these tests through `cargo test -p kvcm-ffi --test python`")

import kvcm  # noqa: E402

GRPC, HTTP, INSTANCE = ENV["KVCM_TEST_GRPC"], ENV["KVCM_TEST_HTTP"], ENV["KVCM_TEST_INSTANCE"]
SPEC_BYTES = 1024

try:
    import numpy
except ImportError:
    numpy = None


def pattern(key):
    return bytes((key * 31 + i) % 256 for i in range(SPEC_BYTES))


class Transfers(unittest.TestCase):
    def setUp(self):
        self.engine = kvcm.Engine(GRPC, HTTP, INSTANCE)

    def tearDown(self):
        self.engine.close()

    def test_put_then_get_reads_the_bytes_back(self):
        keys = [7001, 7002, 7003]
        put = self.engine.put(keys, [[pattern(k)] for k in keys])
        self.assertEqual(put, [kvcm.Outcome("written", "file")] * 3)
        again = self.engine.put(keys, [[memoryview(pattern(k))] for k in keys])
        self.assertEqual([o.status for o in again], ["present"] * 3)
        buffers = [[bytearray(SPEC_BYTES)] for _ in keys]
        got = self.engine.get(keys + [7999], buffers + [[bytearray(SPEC_BYTES)]])
        self.assertEqual(got[:3], [kvcm.Outcome("hit", "file")] * 3)
        self.assertEqual(got[3], kvcm.Outcome("miss", "none"))
        for key, (buffer,) in zip(keys, buffers):
            self.assertEqual(bytes(buffer), pattern(key))

    @unittest.skipIf(numpy is None, "NumPy is not installed (SKIPPED loudly: the NumPy case did not run)")
    def test_numpy_buffers(self):
        self.engine.put([7101], [[numpy.frombuffer(pattern(7101), dtype=numpy.uint8)]])
        target = numpy.zeros(SPEC_BYTES // 4, dtype=numpy.int32)
        got = self.engine.get([7101], [[target]])
        self.assertEqual(got[0].status, "hit")
        self.assertEqual(target.tobytes(), pattern(7101))

    def test_a_wrong_part_size_fails_that_block_only(self):
        put = self.engine.put([7201, 7202], [[b"\0" * 10], [pattern(7202)]])
        self.assertEqual([o.status for o in put], ["failed", "written"])

    def test_registered_memory_moves_blocks_and_refuses_overlap(self):
        memory = bytearray(2 * SPEC_BYTES)
        self.engine.register_memory(memory)
        with self.assertRaises(kvcm.InvalidArgumentError):
            self.engine.register_memory(memoryview(memory)[100:200])
        with self.assertRaises(BufferError):
            memory.extend(b"x")  # exported while registered
        view = memoryview(memory)
        view[:SPEC_BYTES] = pattern(7401)
        put = self.engine.put([7401], [[view[:SPEC_BYTES]]])
        self.assertEqual(put, [kvcm.Outcome("written", "file")])
        got = self.engine.get([7401], [[view[SPEC_BYTES:]]])
        self.assertEqual(got, [kvcm.Outcome("hit", "file")])
        self.assertEqual(bytes(view[SPEC_BYTES:]), pattern(7401))
        view.release()
        self.engine.deregister_memory(memory)
        with self.assertRaises(kvcm.InvalidArgumentError):
            self.engine.deregister_memory(memory)
        memory.extend(b"x")  # released once deregistered

    def test_file_roots_confine_the_engine(self):
        elsewhere = tempfile.mkdtemp()
        try:
            self.engine.set_file_roots([elsewhere])
            self.assertEqual(self.engine.put([7501], [[pattern(7501)]])[0].status, "failed")
            with self.assertRaises(kvcm.InvalidArgumentError):
                self.engine.set_file_roots(["relative/dir"])
            self.assertEqual(self.engine.put([7502], [[pattern(7502)]])[0].status, "failed")
            self.engine.set_file_roots([])
            self.assertEqual(self.engine.put([7503], [[pattern(7503)]]), [kvcm.Outcome("written", "file")])
        finally:
            os.rmdir(elsewhere)

    def test_bad_buffers_are_refused_before_the_call(self):
        with self.assertRaises(ValueError):
            self.engine.get([7301], [[pattern(7301)]])  # read-only
        with self.assertRaises(ValueError):
            self.engine.put([7301, 7302], [[pattern(1)]])  # one block for two keys
        with self.assertRaises(ValueError):
            self.engine.put([7301, 7302], [[pattern(1)], [pattern(2), pattern(3)]])
        with self.assertRaises(TypeError):
            self.engine.put([7301], [[42]])
        shared = bytearray(2 * SPEC_BYTES)
        view = memoryview(shared)
        with self.assertRaises(kvcm.InvalidArgumentError):
            self.engine.get([7301, 7302], [[view[:SPEC_BYTES]], [view[512 : 512 + SPEC_BYTES]]])
        self.engine.close()
        with self.assertRaises(ValueError):
            self.engine.put([7301], [[pattern(7301)]])


if __name__ == "__main__":
    unittest.main()
