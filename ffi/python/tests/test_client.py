"""Tests of the kvcm package against a real server, run by ffi/tests/python.rs.

The Rust test starts the server, writes keys, and passes the addresses, the query keys and
the Rust client's answers (one line per spec: "location type spec_size name uri") in
KVCM_TEST_* variables; every way of passing keys must give exactly those answers.
"""

import ctypes
import os
import socket
import subprocess
import sys
import unittest
from array import array

ENV = os.environ
REQUIRED = ["KVCM_TEST_GRPC", "KVCM_TEST_HTTP", "KVCM_TEST_INSTANCE", "KVCM_FFI_LIB"]
MISSING = [name for name in REQUIRED if not ENV.get(name)]
if MISSING:
    raise RuntimeError(f"run these tests through `cargo test -p kvcm-ffi --test python` ({MISSING} unset)")

import kvcm  # noqa: E402 (after the check, for a clear message)

GRPC, HTTP, INSTANCE = ENV["KVCM_TEST_GRPC"], ENV["KVCM_TEST_HTTP"], ENV["KVCM_TEST_INSTANCE"]
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import numpy
except ImportError:
    numpy = None


def keys(name):
    return [int(k) for k in ENV[name].split(",")]


def expected(name):
    return ENV[name].split("\n") if ENV[name] else []


def lines(locations):
    """The answer in the Rust test's format."""
    out = []
    for i, location in enumerate(locations):
        for spec_name, uri in location.specs:
            out.append(f"{i} {location.type} {location.spec_size} {spec_name} {uri}")
    return out


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lookups(unittest.TestCase):
    def setUp(self):
        self.client = kvcm.Client(GRPC, HTTP, INSTANCE)
        self.prefix_keys = keys("KVCM_TEST_PREFIX_KEYS")
        self.prefix = expected("KVCM_TEST_PREFIX")

    def tearDown(self):
        self.client.close()

    def test_prefix_match_equals_the_rust_client(self):
        self.assertGreater(len(self.prefix), 0)
        self.assertEqual(lines(self.client.prefix_match(self.prefix_keys)), self.prefix)

    def test_every_key_form_gives_the_same_answer(self):
        packed = array("q", self.prefix_keys)
        forms = {
            "list": self.prefix_keys,
            "tuple": tuple(self.prefix_keys),
            "array('q')": packed,
            "bytes": packed.tobytes(),
            "bytearray": bytearray(packed.tobytes()),
            "memoryview q": memoryview(packed),
            "read-only memoryview q": memoryview(packed.tobytes()).cast("q"),
            "read-only memoryview B": memoryview(packed.tobytes()),
        }
        for form, value in forms.items():
            with self.subTest(form=form):
                self.assertEqual(lines(self.client.prefix_match(value)), self.prefix)

    def test_buffers_are_not_copied(self):
        packed = array("q", self.prefix_keys)
        self.assertEqual(kvcm._keys.pointer(packed)[:2], packed.buffer_info())
        raw = packed.tobytes()
        self.assertIs(kvcm._keys.pointer(raw)[0], raw)
        raw_address = ctypes.cast(ctypes.c_char_p(raw), ctypes.c_void_p).value
        self.assertEqual(kvcm._keys.pointer(memoryview(raw).cast("q"))[0], raw_address)
        writable = bytearray(raw)
        writable_address = ctypes.addressof((ctypes.c_char * len(writable)).from_buffer(writable))
        self.assertEqual(kvcm._keys.pointer(writable)[0], writable_address)
        if numpy is not None:
            values = numpy.array(self.prefix_keys, dtype=numpy.int64)
            self.assertEqual(kvcm._keys.pointer(values)[0], values.ctypes.data)

    @unittest.skipIf(numpy is None, "numpy is not installed")
    def test_numpy_arrays(self):
        values = numpy.array(self.prefix_keys, dtype=numpy.int64)
        self.assertEqual(lines(self.client.prefix_match(values)), self.prefix)
        values.flags.writeable = False
        self.assertEqual(lines(self.client.prefix_match(values)), self.prefix)
        with self.assertRaisesRegex(TypeError, "int64"):
            self.client.prefix_match(values.astype(numpy.int32))
        with self.assertRaisesRegex(ValueError, "contiguous"):
            self.client.prefix_match(numpy.array(self.prefix_keys * 2, dtype=numpy.int64)[::2])

    def test_batch_get_and_sliding_window(self):
        batch = self.client.batch_get(keys("KVCM_TEST_BATCH_KEYS"))
        self.assertEqual(lines(batch), expected("KVCM_TEST_BATCH"))
        size = int(ENV["KVCM_TEST_SW_SIZE"])
        window = self.client.sliding_window(array("q", keys("KVCM_TEST_SW_KEYS")), size)
        self.assertEqual(lines(window), expected("KVCM_TEST_SW"))

    def test_results_decode_lazily_and_compare_as_lists(self):
        result = self.client.prefix_match(self.prefix_keys)
        self.assertIsInstance(result, kvcm.Locations)
        self.assertEqual(len(result), len(self.prefix))
        self.assertIsNone(result._decoded, "len() decodes nothing")
        self.client.close()  # a result does not depend on its client
        as_list = list(result)
        self.assertEqual(result, as_list)
        self.assertIsNone(result._result, "the C result is freed once decoded")
        self.assertEqual(lines(result), self.prefix)
        self.assertNotEqual(result, "not locations")

    def test_a_result_read_by_several_threads_at_once_decodes_once(self):
        # ctypes lets another thread run during each library call: threads that read the
        # same fresh result must all see it whole (none reading what another freed, none
        # freeing it twice).
        import threading

        want = lines(self.client.prefix_match(self.prefix_keys))
        results = [self.client.prefix_match(self.prefix_keys) for _ in range(300)]
        seen, errors = [], []

        def read_all():
            try:
                seen.append([lines(result) for result in results])
            except Exception as error:  # noqa: BLE001 (reported below)
                errors.append(error)

        threads = [threading.Thread(target=read_all) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(seen), 4)
        for answers in seen:
            self.assertTrue(all(answer == want for answer in answers))

    def test_result_shape(self):
        location = self.client.prefix_match(self.prefix_keys)[0]
        self.assertIsInstance(location, kvcm.Location)
        self.assertIsInstance(location.type, int)
        self.assertIsInstance(location.spec_size, int)
        name, uri = location.specs[0]
        self.assertEqual(name, "tp0")
        self.assertTrue(uri.startswith("file://"), uri)

    def test_every_wire_gives_the_same_answer(self):
        for wire in ["soft-tcp", "soft-shm", "none", None]:
            with self.subTest(wire=wire), kvcm.Client(GRPC, HTTP, INSTANCE, wire=wire) as client:
                self.assertEqual(lines(client.prefix_match(self.prefix_keys)), self.prefix)
                metrics = client.metrics()
                self.assertIsInstance(metrics, kvcm.Metrics)
                if wire in ("soft-tcp", "soft-shm"):
                    self.assertTrue(client.fast_path_up)
                    self.assertEqual((metrics.hits, metrics.fallbacks), (1, 0))
                else:
                    self.assertFalse(client.fast_path_up)
                    self.assertEqual(metrics.hits, 0)


class ReadReports(unittest.TestCase):
    def test_fast_path_lookups_are_reported_when_asked(self):
        prefix_keys = keys("KVCM_TEST_PREFIX_KEYS")
        with kvcm.Client(GRPC, HTTP, INSTANCE, wire="soft-tcp") as client:
            client.prefix_match(prefix_keys)
            self.assertEqual(client.flush_read_reports(), (0, 0), "off by default")
            client.set_read_reports(True)
            for _ in range(3):
                client.prefix_match(prefix_keys)
            self.assertEqual(client.flush_read_reports(), (3, 0))
            client.set_read_reports(False)
            client.prefix_match(prefix_keys)
            self.assertEqual(client.flush_read_reports(), (3, 0))


class BadInput(unittest.TestCase):
    def setUp(self):
        self.client = kvcm.Client(GRPC, HTTP, INSTANCE)

    def tearDown(self):
        self.client.close()

    def test_str_keys_are_a_type_error(self):
        with self.assertRaisesRegex(TypeError, r"int64 block keys: element 1 is str '2'"):
            self.client.prefix_match([1, "2", 3])
        with self.assertRaisesRegex(TypeError, "not str"):
            self.client.prefix_match("123")
        with self.assertRaisesRegex(TypeError, "element 0 is float"):
            self.client.batch_get([1.5])
        with self.assertRaisesRegex(TypeError, "int is not iterable"):
            self.client.batch_get(5)

    def test_bad_buffers(self):
        with self.assertRaisesRegex(TypeError, "format 'i'"):
            self.client.prefix_match(array("i", [1, 2]))
        with self.assertRaisesRegex(ValueError, "multiple of 8"):
            self.client.prefix_match(b"1234567")
        with self.assertRaisesRegex(ValueError, "contiguous"):
            self.client.prefix_match(memoryview(array("q", range(10)))[::2])
        with self.assertRaisesRegex(ValueError, "aligned"):
            self.client.prefix_match(memoryview(bytearray(17))[1:])
        with self.assertRaisesRegex(OverflowError, "element 1"):
            self.client.prefix_match([1, 1 << 63])

    def test_bad_sw_size(self):
        with self.assertRaises(TypeError):
            self.client.sliding_window([1], "3")
        with self.assertRaises(OverflowError):
            self.client.sliding_window([1], 1 << 40)

    def test_unknown_instance_is_a_server_error(self):
        with kvcm.Client(GRPC, HTTP, "no-such-instance") as client:
            with self.assertRaises(kvcm.ServerError) as caught:
                client.prefix_match([1, 2])
        self.assertEqual(caught.exception.code, kvcm.errors.INSTANCE_NOT_EXIST)
        self.assertTrue(caught.exception.message, "the server's message is kept")

    def test_bad_connect_arguments(self):
        with self.assertRaisesRegex(ValueError, "wire must be one of"):
            kvcm.Client(GRPC, HTTP, INSTANCE, wire="rdma")
        with self.assertRaises(kvcm.InvalidArgumentError) as caught:
            kvcm.Client(GRPC, "not-an-address", INSTANCE)
        self.assertEqual(caught.exception.code, kvcm.errors.E_INVALID_ARGUMENT)
        with self.assertRaisesRegex(kvcm.InvalidArgumentError, "instance_id is empty"):
            kvcm.Client(GRPC, HTTP, "")
        with self.assertRaisesRegex(TypeError, "grpc must be str"):
            kvcm.Client(None, HTTP, INSTANCE)
        with self.assertRaisesRegex(ValueError, "NUL"):
            kvcm.Client(GRPC, HTTP, "a\0b")

    def test_unreachable_server(self):
        address = f"127.0.0.1:{closed_port()}"
        with kvcm.Client(address, address, INSTANCE) as client:
            with self.assertRaises(kvcm.UnreachableError) as caught:
                client.prefix_match([1])
        self.assertEqual(caught.exception.code, kvcm.errors.E_UNREACHABLE)

    def test_closed_client(self):
        client = kvcm.Client(GRPC, HTTP, INSTANCE)
        client.close()
        client.close()
        with self.assertRaisesRegex(ValueError, "closed"):
            client.prefix_match([1])
        with self.assertRaisesRegex(ValueError, "closed"):
            client.metrics()


class Decoding(unittest.TestCase):
    """The one-pass decoder on a view built here (strings a server would rarely send)."""

    def view(self, strings, starts, types):
        heap = b"".join(text.encode() + b"\0" for text in strings)
        offsets = [0]
        for text in strings:
            offsets.append(offsets[-1] + len(text.encode()) + 1)
        self.keep = [
            (ctypes.c_size_t * len(offsets))(*offsets),
            (ctypes.c_size_t * len(starts))(*starts),
            (ctypes.c_int32 * len(types))(*types),
            ctypes.create_string_buffer(heap, len(heap)),
        ]
        offsets_c, starts_c, types_c, heap_c = self.keep
        return kvcm._lib.FlatView(
            count=len(types),
            types=ctypes.cast(types_c, ctypes.POINTER(ctypes.c_int32)),
            spec_sizes=ctypes.cast(types_c, ctypes.POINTER(ctypes.c_int32)),
            spec_starts=ctypes.cast(starts_c, ctypes.POINTER(ctypes.c_size_t)),
            spec_total=len(strings) // 2,
            string_offsets=ctypes.cast(offsets_c, ctypes.POINTER(ctypes.c_size_t)),
            strings=ctypes.addressof(heap_c),
            strings_len=len(heap),
        )

    def test_strings_with_a_nul_inside_and_non_ascii(self):
        strings = ["tp0", "file://é", "tp\0x", "", "n", "u"]
        view = self.view(strings, [0, 2, 2, 3], [4, 5, 6])
        self.assertEqual(kvcm.client._strings(view, 3), strings)
        plain = strings[:2] + ["tp1", ""] + strings[4:]
        self.assertEqual(kvcm.client._strings(self.view(plain, [0, 2, 2, 3], [4, 5, 6]), 3), plain)

    def test_specs_are_grouped_per_location(self):
        strings = ["a", "1", "b", "2", "c", "3"]
        view = self.view(strings, [0, 2, 2, 3], [4, 5, 6])
        decoded = kvcm.client._locations(view)
        self.assertEqual([loc.specs for loc in decoded], [[("a", "1"), ("b", "2")], [], [("c", "3")]])
        self.assertEqual([loc.type for loc in decoded], [4, 5, 6])


class Loading(unittest.TestCase):
    def import_in_subprocess(self, library):
        env = dict(ENV, PYTHONPATH=PACKAGE_DIR)
        env.pop("KVCM_FFI_LIB", None)
        if library is not None:
            env["KVCM_FFI_LIB"] = library
        return subprocess.run([sys.executable, "-c", "import kvcm"], env=env, capture_output=True, text=True)

    def test_missing_library_names_the_build_command(self):
        cases = ["/nonexistent/libkvcm_ffi.so"]
        if not os.path.exists(os.path.join(PACKAGE_DIR, "kvcm", "libkvcm_ffi.so")):
            cases.append(None)  # no KVCM_FFI_LIB and nothing bundled
        for library in cases:
            with self.subTest(library=library):
                done = self.import_in_subprocess(library)
                self.assertNotEqual(done.returncode, 0)
                self.assertIn("ImportError", done.stderr)
                self.assertIn("cargo build --release -p kvcm-ffi", done.stderr)

    def test_the_configured_library_loads(self):
        done = self.import_in_subprocess(ENV["KVCM_FFI_LIB"])
        self.assertEqual(done.returncode, 0, done.stderr)


if __name__ == "__main__":
    unittest.main()
