/*
 * C caller latency of kvcm_prefix_match, run by tests/c_abi.rs (ignored test
 * c_vs_rust_prefix_128_report) beside the same loop in Rust.
 *
 *   bench GRPC HTTP INSTANCE WIRE COUNT ITERATIONS
 *     Looks up the prefix of keys 1..=COUNT ITERATIONS times (after 1000 warm-up calls)
 *     and prints "p50_ns N", the median of the per-call times.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kvcm.h"

static int compare(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void lookup(const kvcm_client *client, const int64_t *keys, size_t count) {
    kvcm_locations *found = NULL;
    char *message = NULL;
    int32_t status = kvcm_prefix_match(client, keys, count, &found, &message);
    if (status != KVCM_OK || kvcm_locations_count(found) != count) {
        fprintf(stderr, "lookup failed: %d %s\n", status, message ? message : "");
        exit(1);
    }
    kvcm_locations_free(found);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: bench GRPC HTTP INSTANCE WIRE COUNT ITERATIONS\n");
        return 2;
    }
    kvcm_client *client = NULL;
    char *message = NULL;
    int32_t status = kvcm_client_connect(argv[1], argv[2], argv[3], atoi(argv[4]), &client, &message);
    if (status != KVCM_OK) {
        fprintf(stderr, "connect failed: %d %s\n", status, message ? message : "");
        return 1;
    }
    size_t count = (size_t)atol(argv[5]);
    size_t iterations = (size_t)atol(argv[6]);
    int64_t *keys = malloc(count * sizeof *keys);
    long long *times = malloc(iterations * sizeof *times);
    if (!keys || !times) return 1;
    for (size_t i = 0; i < count; i++) keys[i] = (int64_t)(i + 1);
    for (int i = 0; i < 1000; i++) lookup(client, keys, count);
    for (size_t i = 0; i < iterations; i++) {
        long long begun = now_ns();
        lookup(client, keys, count);
        times[i] = now_ns() - begun;
    }
    qsort(times, iterations, sizeof *times, compare);
    printf("p50_ns %lld\n", times[iterations / 2]);
    kvcm_client_free(client);
    free(keys);
    free(times);
    return 0;
}
