"""The kvcm package against a server with kvcm.auth.meta = required, run by
ffi/tests/python.rs (`python_auth_tests`): KVCM_TEST_API_KEY names the instance
KVCM_TEST_INSTANCE, whose KVCM_TEST_KEYS were written.
"""

import os
import unittest

ENV = os.environ
REQUIRED = ["KVCM_TEST_GRPC", "KVCM_TEST_HTTP", "KVCM_TEST_INSTANCE", "KVCM_TEST_API_KEY", "KVCM_FFI_LIB"]
MISSING = [name for name in REQUIRED if not ENV.get(name)]
if MISSING:
    raise RuntimeError(f"run these tests through `cargo test -p kvcm-ffi --test python` ({MISSING} unset)")

import kvcm  # noqa: E402 (after the check, for a clear message)

GRPC, HTTP, INSTANCE = ENV["KVCM_TEST_GRPC"], ENV["KVCM_TEST_HTTP"], ENV["KVCM_TEST_INSTANCE"]
KEYS = [int(k) for k in ENV["KVCM_TEST_KEYS"].split(",")]
SPEC_BYTES = 1024  # the size of the instance's one spec (the harness registers it)
ENGINE_KEY = 3901


class ApiKeys(unittest.TestCase):
    def test_the_key_reads_its_instance_on_the_fast_path(self):
        with kvcm.Client(GRPC, HTTP, INSTANCE, api_key=ENV["KVCM_TEST_API_KEY"]) as client:
            self.assertTrue(client.fast_path_up)
            self.assertEqual(len(client.prefix_match(KEYS)), len(KEYS))

    def test_no_key_or_another_key_is_unauthorized(self):
        forged = "kvcm_" + "0" * 16 + "_" + "0" * 64
        for api_key in [None, forged]:
            with kvcm.Client(GRPC, HTTP, INSTANCE, api_key=api_key) as client:
                with self.assertRaises(kvcm.UnauthorizedError) as refused:
                    client.prefix_match(KEYS)
                self.assertEqual(refused.exception.code, -9)
                self.assertIn("access check", refused.exception.message)

    def test_an_engine_with_the_key_writes_and_one_without_is_unauthorized(self):
        part = bytes(range(256)) * (SPEC_BYTES // 256)
        with kvcm.Engine(GRPC, HTTP, INSTANCE, api_key=ENV["KVCM_TEST_API_KEY"]) as engine:
            self.assertEqual(engine.put([ENGINE_KEY], [[part]]), [kvcm.Outcome("written", "file")])
            target = bytearray(SPEC_BYTES)
            self.assertEqual(engine.get([ENGINE_KEY], [[target]])[0].status, "hit")
            self.assertEqual(bytes(target), part)
        with kvcm.Engine(GRPC, HTTP, INSTANCE) as engine:
            with self.assertRaises(kvcm.UnauthorizedError) as refused:
                engine.put([ENGINE_KEY + 1], [[part]])
            self.assertEqual(refused.exception.code, -9)

    def test_a_bad_key_argument_is_refused_before_connecting(self):
        with self.assertRaises(TypeError):
            kvcm.Client(GRPC, HTTP, INSTANCE, api_key=b"bytes")
        with self.assertRaises(ValueError):
            kvcm.Client(GRPC, HTTP, INSTANCE, api_key="a\0b")
        with self.assertRaises(TypeError):
            kvcm.Engine(GRPC, HTTP, INSTANCE, api_key=b"bytes")


if __name__ == "__main__":
    unittest.main()
