"""The kvcm package against a server serving mutual TLS, run by ffi/tests/python.rs
(`python_tls_tests`): KVCM_TEST_GRPC is its https:// endpoint, KVCM_TEST_TLS_CA the CA of
its certificate (issued for localhost), KVCM_TEST_TLS_CERT / KVCM_TEST_TLS_KEY a client
certificate it trusts and its key; the KVCM_TEST_KEYS of KVCM_TEST_INSTANCE were written.
"""

import os
import pathlib
import unittest

ENV = os.environ
REQUIRED = [
    "KVCM_TEST_GRPC",
    "KVCM_TEST_HTTP",
    "KVCM_TEST_INSTANCE",
    "KVCM_TEST_KEYS",
    "KVCM_TEST_TLS_CA",
    "KVCM_TEST_TLS_CERT",
    "KVCM_TEST_TLS_KEY",
    "KVCM_FFI_LIB",
]
MISSING = [name for name in REQUIRED if not ENV.get(name)]
if MISSING:
    raise RuntimeError(f"run these tests through `cargo test -p kvcm-ffi --test python` ({MISSING} unset)")

import kvcm  # noqa: E402 (after the check, for a clear message)

GRPC, HTTP, INSTANCE = ENV["KVCM_TEST_GRPC"], ENV["KVCM_TEST_HTTP"], ENV["KVCM_TEST_INSTANCE"]
KEYS = [int(k) for k in ENV["KVCM_TEST_KEYS"].split(",")]
CA, CERT, KEY = ENV["KVCM_TEST_TLS_CA"], ENV["KVCM_TEST_TLS_CERT"], ENV["KVCM_TEST_TLS_KEY"]
BARE = GRPC.split("://", 1)[1]
SPEC_BYTES = 1024  # the size of the instance's one spec (the harness registers it)
ENGINE_KEY = 4901


class Tls(unittest.TestCase):
    def test_a_client_certificate_reads_on_the_fast_path(self):
        # A bare host:port means https:// with TLS; paths may be str or os.PathLike.
        tls = dict(tls_ca=pathlib.Path(CA), tls_cert=CERT, tls_key=KEY)
        with kvcm.Client(BARE, HTTP, INSTANCE, **tls) as client:
            self.assertTrue(client.fast_path_up)
            self.assertEqual(len(client.prefix_match(KEYS)), len(KEYS))
            self.assertEqual(client.metrics().hits, 1)
        # Every lookup over gRPC (TLS), the server name given explicitly.
        with kvcm.Client(GRPC, HTTP, INSTANCE, wire="none", tls_server_name="localhost", **tls) as client:
            self.assertEqual(len(client.prefix_match(KEYS)), len(KEYS))
            self.assertEqual(client.metrics().hits, 0)

    def test_plaintext_or_no_certificate_reaches_nothing(self):
        for name, grpc, tls in [
            ("plaintext", "http://" + BARE, {}),
            ("no client certificate", BARE, dict(tls_ca=CA)),
        ]:
            with self.subTest(name), kvcm.Client(grpc, HTTP, INSTANCE, **tls) as client:
                self.assertFalse(client.fast_path_up)
                with self.assertRaises(kvcm.UnreachableError) as failed:
                    client.prefix_match(KEYS)
                self.assertEqual(failed.exception.code, -4)

    def test_an_engine_puts_and_gets_over_tls(self):
        part = bytes((i * 7 + 3) % 256 for i in range(SPEC_BYTES))
        tls = dict(tls_ca=CA, tls_cert=CERT, tls_key=KEY)
        with kvcm.Engine(BARE, HTTP, INSTANCE, **tls) as engine:
            self.assertEqual(engine.put([ENGINE_KEY], [[part]]), [kvcm.Outcome("written", "file")])
            target = bytearray(SPEC_BYTES)
            self.assertEqual(engine.get([ENGINE_KEY], [[target]]), [kvcm.Outcome("hit", "file")])
            self.assertEqual(bytes(target), part)
        # A plaintext engine of the same server reaches nothing.
        with kvcm.Engine("http://" + BARE, HTTP, INSTANCE) as engine:
            with self.assertRaises(kvcm.UnreachableError) as failed:
                engine.put([ENGINE_KEY + 1], [[part]])
            self.assertEqual(failed.exception.code, -4)

    def test_bad_tls_arguments_are_refused(self):
        with self.assertRaises(kvcm.InvalidArgumentError) as refused:
            kvcm.Client(BARE, HTTP, INSTANCE, tls_ca=CA, tls_cert=CERT)
        self.assertEqual(refused.exception.code, -3)
        self.assertIn("tls.key_file", refused.exception.message)
        with self.assertRaises(kvcm.InvalidArgumentError) as refused:
            kvcm.Client(BARE, HTTP, INSTANCE, tls_ca=CA + ".missing", tls_cert=CERT, tls_key=KEY)
        self.assertIn("tls.ca_file", refused.exception.message)
        with self.assertRaises(kvcm.InvalidArgumentError) as refused:
            kvcm.Client("http://" + BARE, HTTP, INSTANCE, tls_ca=CA, tls_cert=CERT, tls_key=KEY)
        self.assertIn("must start with https://", refused.exception.message)
        with self.assertRaises(ValueError) as refused:
            kvcm.Client(BARE, HTTP, INSTANCE, tls_cert=CERT, tls_key=KEY)
        self.assertIn("without tls_ca", str(refused.exception))
        with self.assertRaises(TypeError):
            kvcm.Client(BARE, HTTP, INSTANCE, tls_ca=b"/bytes/path")
        # The engine takes the same arguments, checked the same way.
        with self.assertRaises(kvcm.InvalidArgumentError) as refused:
            kvcm.Engine(BARE, HTTP, INSTANCE, tls_ca=CA, tls_key=KEY)
        self.assertIn("tls.cert_file", refused.exception.message)
        with self.assertRaises(ValueError):
            kvcm.Engine(BARE, HTTP, INSTANCE, tls_server_name="localhost")


if __name__ == "__main__":
    unittest.main()
