/*
 * C client of kvcm.h, run by tests/c_abi.rs against a real server.
 *
 *   client_test lookup QUERY GRPC HTTP INSTANCE WIRE KEY...
 *     QUERY: prefix | batch | sliding:N. Prints one line per spec,
 *     "location type spec_size name uri", read with the per-item accessors and checked
 *     against the flat view; then "metrics hits=H fallbacks=F".
 *   client_test errors GRPC HTTP
 *     Prints "case status" for bad input (NULL client, NULL keys with count > 0, unknown
 *     instance, invalid UTF-8, unknown wire, bad kvcm_tls fields), checking each message is
 *     set (and names the kvcm_tls field) and freeing it.
 *
 * Exit status 0 on success, 1 on a call that failed or a check that did not hold.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcm.h"

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static void fail(const char *what, int32_t status, char *message) {
    fprintf(stderr, "%s failed: %d %s\n", what, status, message ? message : "(no message)");
    kvcm_string_free(message);
    exit(1);
}

static kvcm_client *open_client(const char *grpc, const char *http, const char *instance,
                            int32_t wire) {
    kvcm_client *client = NULL;
    char *message = NULL;
    int32_t status = kvcm_client_connect(grpc, http, instance, wire, &client, &message);
    if (status != KVCM_OK) fail("kvcm_client_connect", status, message);
    CHECK(client != NULL && message == NULL);
    return client;
}

/* Whether `a` is the string of the view that starts at `start` and whose NUL is at end - 1. */
static int same(kvcm_str a, const char *base, size_t start, size_t end) {
    return a.ptr == base + start && a.len == end - start - 1 && a.ptr[a.len] == '\0';
}

/* Prints every spec through the accessors, and checks the view says the same. */
static void print_locations(const kvcm_locations *locations) {
    kvcm_flat_view view;
    CHECK(kvcm_locations_view(locations, &view) == KVCM_OK);
    size_t count = kvcm_locations_count(locations);
    CHECK(view.count == count);
    for (size_t i = 0; i < count; i++) {
        int32_t type = 0, spec_size = 0;
        size_t specs = 0;
        CHECK(kvcm_location_get(locations, i, &type, &spec_size, &specs) == KVCM_OK);
        CHECK(view.types[i] == type && view.spec_sizes[i] == spec_size);
        CHECK(view.spec_starts[i + 1] - view.spec_starts[i] == specs);
        for (size_t j = 0; j < specs; j++) {
            kvcm_str name, uri;
            CHECK(kvcm_location_spec(locations, i, j, &name, &uri) == KVCM_OK);
            size_t s = view.spec_starts[i] + j;
            const size_t *off = view.string_offsets;
            CHECK(same(name, view.strings, off[2 * s], off[2 * s + 1]));
            CHECK(same(uri, view.strings, off[2 * s + 1], off[2 * s + 2]));
            printf("%zu %d %d %.*s %.*s\n", i, type, spec_size, (int)name.len, name.ptr,
                   (int)uri.len, uri.ptr);
        }
        kvcm_str name, uri;
        CHECK(kvcm_location_spec(locations, i, specs, &name, &uri) == KVCM_E_OUT_OF_RANGE);
    }
    CHECK(kvcm_location_get(locations, count, NULL, NULL, NULL) == KVCM_E_OUT_OF_RANGE);
    CHECK(view.string_offsets[2 * view.spec_total] == view.strings_len);
}

static int lookup(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: client_test lookup QUERY GRPC HTTP INSTANCE WIRE KEY...\n");
        return 1;
    }
    const char *query = argv[2];
    size_t count = (size_t)(argc - 7);
    int64_t *keys = calloc(count + 1, sizeof(int64_t));
    CHECK(keys != NULL);
    for (size_t i = 0; i < count; i++) keys[i] = strtoll(argv[7 + i], NULL, 10);
    kvcm_client *client = open_client(argv[3], argv[4], argv[5], (int32_t)atoi(argv[6]));

    kvcm_locations *locations = NULL;
    char *message = NULL;
    int32_t status;
    if (strcmp(query, "prefix") == 0) {
        status = kvcm_prefix_match(client, keys, count, &locations, &message);
    } else if (strcmp(query, "batch") == 0) {
        status = kvcm_batch_get(client, keys, count, &locations, &message);
    } else if (strncmp(query, "sliding:", 8) == 0) {
        int32_t sw_size = (int32_t)atoi(query + 8);
        status = kvcm_sliding_window(client, keys, count, sw_size, &locations, &message);
    } else {
        fprintf(stderr, "unknown query %s\n", query);
        return 1;
    }
    if (status != KVCM_OK) fail(query, status, message);
    CHECK(message == NULL && locations != NULL);
    print_locations(locations);
    kvcm_locations_free(locations);

    kvcm_fast_path_metrics metrics;
    CHECK(kvcm_client_metrics(client, &metrics) == KVCM_OK);
    printf("metrics hits=%llu fallbacks=%llu\n", (unsigned long long)metrics.hits,
           (unsigned long long)metrics.fallbacks);
    kvcm_client_free(client);
    free(keys);
    return 0;
}

/* Prints "name status" and checks a message came with the error. */
static void report(const char *name, int32_t status, char *message) {
    CHECK(status == KVCM_OK || message != NULL);
    printf("%s %d\n", name, status);
    kvcm_string_free(message);
}

/* As report, checking that the message names `field`. */
static void report_naming(const char *name, int32_t status, char *message, const char *field) {
    CHECK(message != NULL && strstr(message, field) != NULL);
    report(name, status, message);
}

static int errors(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: client_test errors GRPC HTTP\n");
        return 1;
    }
    const char *grpc = argv[2], *http = argv[3];
    int64_t keys[2] = {1, 2};
    kvcm_locations *locations = (kvcm_locations *)keys; /* must be reset to NULL */
    char *message = NULL;

    int32_t status = kvcm_prefix_match(NULL, keys, 2, &locations, &message);
    CHECK(locations == NULL);
    report("null_client", status, message);

    kvcm_client *unknown = open_client(grpc, http, "no-such-instance", KVCM_WIRE_SOFT_TCP);
    status = kvcm_prefix_match(unknown, NULL, 2, &locations, &message);
    report("null_keys", status, message);
    status = kvcm_prefix_match(unknown, keys, 2, &locations, &message);
    CHECK(locations == NULL);
    report("unknown_instance", status, message);
    status = kvcm_prefix_match(unknown, keys, 2, &locations, NULL); /* no message wanted */
    printf("unknown_instance_no_message %d\n", status);
    kvcm_client_free(unknown);

    kvcm_client *client = (kvcm_client *)keys;
    status = kvcm_client_connect(grpc, http, "\xff\xfe", KVCM_WIRE_NONE, &client, &message);
    CHECK(client == NULL);
    report("invalid_utf8", status, message);
    status = kvcm_client_connect(grpc, http, "i", 7, &client, &message);
    report("unknown_wire", status, message);
    status = kvcm_client_connect(NULL, http, "i", KVCM_WIRE_NONE, &client, &message);
    report("null_grpc", status, message);

    /* kvcm_tls as C lays it out: each case is refused for the field it sets or leaves out. */
    kvcm_tls tls = {NULL, "client.pem", "client.key", NULL};
    status = kvcm_client_connect_tls(grpc, http, "i", KVCM_WIRE_NONE, NULL, &tls, &client,
                                     &message);
    CHECK(client == NULL);
    report_naming("tls_null_ca_file", status, message, "tls.ca_file");
    kvcm_tls no_key = {"ca.pem", "client.pem", NULL, NULL};
    status = kvcm_client_connect_tls(grpc, http, "i", KVCM_WIRE_NONE, NULL, &no_key, &client,
                                     &message);
    report_naming("tls_cert_without_key", status, message, "tls.key_file is NULL");
    kvcm_tls bad_name = {"ca.pem", NULL, NULL, "\xff\xfe"};
    status = kvcm_client_connect_tls(grpc, http, "i", KVCM_WIRE_NONE, NULL, &bad_name, &client,
                                     &message);
    report_naming("tls_server_name_not_utf8", status, message, "tls.server_name");

    kvcm_fast_path_metrics metrics;
    printf("null_metrics %d\n", kvcm_client_metrics(NULL, &metrics));
    printf("null_count %zu\n", kvcm_locations_count(NULL));
    kvcm_locations_free(NULL);
    kvcm_client_free(NULL);
    kvcm_string_free(NULL);
    return 0;
}

int main(int argc, char **argv) {
    CHECK(kvcm_abi_version() == 1);
    if (argc > 1 && strcmp(argv[1], "lookup") == 0) return lookup(argc, argv);
    if (argc > 1 && strcmp(argv[1], "errors") == 0) return errors(argc, argv);
    fprintf(stderr, "usage: client_test lookup|errors ...\n");
    return 1;
}
