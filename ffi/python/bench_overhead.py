"""What the Python layer adds to a prefix-16 lookup, in µs per call.

Run through `cargo test -p kvcm-ffi --test python -- --ignored --nocapture` (it starts a
server, writes 16 keys and sets KVCM_FFI_LIB and KVCM_TEST_*), or by hand with those set.

Compared, interleaved in rounds so that drift hits all alike (median of the rounds):
  c-direct   kvcm_prefix_match through ctypes on a pre-built buffer, result freed, nothing
             decoded: the floor of any binding;
  array('q') kvcm.Client.prefix_match on an array('q') (the result's locations are decoded
             on first access: this is the call alone, enough to read how many matched);
  list       kvcm.Client.prefix_match on a list of ints (converted per call);
  array('q')+use  the same call, then one location read (which decodes all 16).
The differences include the network's noise, so the Python work alone is also timed on a
held result with no server call: key conversion plus decoding 16 locations. A fourth input,
c-direct+wait, makes the bare C call and then busy-waits as long as that Python work takes:
what the transport itself charges a caller that is not back at once (polling threads that
back off), which is not Python's cost.
"""

import ctypes
import os
import statistics
import sys
import time
from array import array
from ctypes import byref, c_void_p

import kvcm
from kvcm import _keys, client as client_module
from kvcm._lib import LIB

ROUNDS = 30
CALLS = 300


def per_call_us(function, calls):
    start = time.perf_counter()
    for _ in range(calls):
        function()
    return (time.perf_counter() - start) / calls * 1e6


def direct(client, packed):
    """The bare C call on a pre-built buffer (no conversion, no decoding)."""
    address, count = packed.buffer_info()
    handle = client._handle
    out, message = c_void_p(), c_void_p()
    out_ref, message_ref = byref(out), byref(message)
    function, free = LIB.kvcm_prefix_match, LIB.kvcm_locations_free

    def call():
        if function(handle, address, count, out_ref, message_ref):
            raise RuntimeError("kvcm_prefix_match failed")
        free(out)

    return call


def waiting(call, seconds):
    """`call`, then a busy wait of `seconds` (the caller's think time)."""
    clock = time.perf_counter

    def wait_after():
        call()
        end = clock() + seconds
        while clock() < end:
            pass

    return wait_after


def held_result(client, packed):
    """A result kept alive, to time decoding without a server call."""
    out, message = c_void_p(), c_void_p()
    address, count = packed.buffer_info()
    status = LIB.kvcm_prefix_match(client._handle, address, count, byref(out), byref(message))
    assert status == 0, status
    return out


def report(wire, keys):
    packed = array("q", keys)
    with kvcm.Client(os.environ["KVCM_TEST_GRPC"], os.environ["KVCM_TEST_HTTP"], os.environ["KVCM_TEST_INSTANCE"], wire=wire) as client:
        assert len(client.prefix_match(packed)) == 16, "16 written keys must match"
        result = held_result(client, packed)
        try:
            decode = per_call_us(lambda: client_module._decode(result), 20000)
        finally:
            LIB.kvcm_locations_free(result)
        convert_array = per_call_us(lambda: _keys.pointer(packed), 20000)
        convert_list = per_call_us(lambda: _keys.pointer(keys), 20000)
        cases = {
            "c-direct": direct(client, packed),
            "c-direct+wait": waiting(direct(client, packed), (decode + convert_array) / 1e6),
            "array('q')": lambda: client.prefix_match(packed),
            "list": lambda: client.prefix_match(keys),
            "array('q')+use": lambda: client.prefix_match(packed)[0],
        }
        rounds = {name: [] for name in cases}
        for _ in range(ROUNDS):
            for name, function in cases.items():
                rounds[name].append(per_call_us(function, CALLS))
        print(f"wire {wire}: fast path up {client.fast_path_up}, {client.metrics()}")
    floor = statistics.median(rounds["c-direct"])
    print(f"  {'input':<14} {'µs/call':>8} {'added vs c-direct':>18}")
    for name, values in rounds.items():
        median = statistics.median(values)
        print(f"  {name:<14} {median:8.2f} {median - floor:+18.2f}")
    print(f"  Python work alone: decode 16 locations {decode:.2f} µs; keys to pointer: array('q') {convert_array:.2f} µs, list {convert_list:.2f} µs")


def main():
    keys = [int(k) for k in os.environ["KVCM_TEST_PREFIX_KEYS"].split(",")][:16]
    print(f"prefix-16 lookups, {ROUNDS} rounds x {CALLS} calls per input, Python {sys.version.split()[0]}, ctypes {ctypes.__version__}")
    for wire in ["soft-shm", "soft-tcp", "none"]:
        report(wire, keys)


if __name__ == "__main__":
    main()
