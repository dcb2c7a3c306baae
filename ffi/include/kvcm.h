/*
 * kvcm.h: the C ABI of the kvcm client (crate kvcm-ffi, library libkvcm_ffi).
 *
 * Build: cargo build --release -p kvcm-ffi   (target/release/libkvcm_ffi.so and .a)
 *
 * Status codes. Every fallible call returns an int32_t: KVCM_OK (0) on success, a negative
 * KVCM_E_* for an error found in the library, or, when the server answered an error, the
 * server's wire ErrorCode (a positive number > 1, e.g. 8 = INSTANCE_NOT_EXIST, 5 =
 * INVALID_ARGUMENT; see proto/meta_service.proto).
 *
 * Error messages. Calls that take `char** error_message` accept NULL there. When it is not
 * NULL, *error_message is set on every return: NULL on success, else a NUL-terminated UTF-8
 * message owned by the caller, to be freed with kvcm_string_free.
 *
 * Ownership. The library hands out four kinds of objects, each freed by the caller exactly
 * once with its own function (all accept NULL as a no-op):
 *   kvcm_client*     kvcm_client_free
 *   kvcm_engine*     kvcm_engine_free
 *   kvcm_locations*  kvcm_locations_free
 *   char*            kvcm_string_free   (error messages)
 * Strings and arrays read from a kvcm_locations (kvcm_str, kvcm_flat_view) are borrowed
 * from it: they stay valid and unchanged until kvcm_locations_free on that result, and must
 * not be freed or written. Borrowed strings are UTF-8, `len` bytes, followed by a NUL byte (so
 * s.ptr is also a C string, unless the server put a NUL inside it; `len` is authoritative).
 * On failure every output pointer a call hands out (*client_out, *out) is set to NULL.
 *
 * Inputs. NULL pointers and invalid UTF-8 are reported as KVCM_E_NULL_ARGUMENT and
 * KVCM_E_INVALID_UTF8, never undefined behaviour; `keys` may be NULL only when `count` is 0
 * and must be aligned to 8 bytes. No call aborts the process: an internal panic is caught and
 * returned as KVCM_E_PANIC.
 *
 * Thread safety. A kvcm_client may be shared by any number of threads; its calls serialise on
 * one connection, so give each thread its own client for parallel lookups. Results are
 * independent of the client and of each other: a result may be read from any thread, and may
 * outlive the client (each thread that looks up keeps the library's working copy of its
 * answers, as large as its largest, reused by its next lookup until the thread exits). Do not free a client while a
 * call on it is in flight. A kvcm_engine
 * may be shared too; its calls run one at a time (one engine per thread for parallelism).
 *
 * Blocking. Lookups block the calling thread until answered (one round trip on the fast path,
 * else a gRPC call). A Rust caller must not call them from a tokio runtime thread (the gRPC
 * fallback runs its own runtime); it would get KVCM_E_PANIC.
 */
#ifndef KVCM_H
#define KVCM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes (besides the server's positive wire codes). */
#define KVCM_OK 0
#define KVCM_E_NULL_ARGUMENT (-1)     /* a required pointer was NULL */
#define KVCM_E_INVALID_UTF8 (-2)      /* a string argument is not UTF-8 */
#define KVCM_E_INVALID_ARGUMENT (-3)  /* bad address, unknown wire, empty instance id, misaligned keys */
#define KVCM_E_UNREACHABLE (-4)       /* no server could be reached */
#define KVCM_E_PANIC (-5)             /* internal error, caught; the library stays usable */
#define KVCM_E_OUT_OF_RANGE (-6)      /* an index past the end of a result */
#define KVCM_E_BAD_ANSWER (-7)        /* the server answered an error without a usable code */
#define KVCM_E_DEVICE (-8)            /* the device (GPU) holding the blocks failed or is missing */
#define KVCM_E_UNAUTHORIZED (-9)      /* the server refused the API key, or what it may call */

/* Wires of the fast path (kvcm_client_connect's `wire`). */
#define KVCM_WIRE_NONE 0      /* no fast path: every lookup over gRPC */
#define KVCM_WIRE_SOFT_TCP 1  /* one-sided READs over soft-TCP (works across hosts) */
#define KVCM_WIRE_SOFT_SHM 2  /* one-sided READs over shared memory (server's host only) */
#define KVCM_WIRE_VERBS 3     /* one-sided READs over RDMA verbs (a library built with
                                 `cargo build -p kvcm-ffi --features rdma`, else refused;
                                 KVCM_VERBS_DEVICE, KVCM_VERBS_GID_INDEX pick the device) */

/* Block outcomes of kvcm_engine_put (outcomes[i]). */
#define KVCM_PUT_WRITTEN 1     /* written and committed */
#define KVCM_PUT_PRESENT 2     /* already cached: nothing written */
#define KVCM_PUT_FAILED 3      /* not stored */
/* Block outcomes of kvcm_engine_get (outcomes[i]). */
#define KVCM_GET_HIT 1         /* every part read into its buffer */
#define KVCM_GET_MISS 2        /* not cached */
#define KVCM_GET_UNREADABLE 3  /* cached but not readable whole (node gone, checksum mismatch): a miss */
/* Paths a block's bytes took (paths[i]). */
#define KVCM_PATH_NONE 0           /* nothing moved */
#define KVCM_PATH_POOL_SOFT_TCP 1  /* a pool node over soft-TCP */
#define KVCM_PATH_POOL_SOFT_SHM 2  /* a pool node over shared memory */
#define KVCM_PATH_FILE 3           /* the file tier (io_uring or psync) */
#define KVCM_PATH_POOL_VERBS 4     /* a pool node over RDMA verbs */
#define KVCM_PATH_POOL_SOFT_TCP_ZERO_COPY 5  /* soft-TCP, zero-copy from / into registered memory */
#define KVCM_PATH_POOL_VERBS_ZERO_COPY 6     /* verbs, zero-copy from / into registered memory */

/* A connected client (opaque). */
typedef struct kvcm_client kvcm_client;

/* A transfer engine (opaque): moves whole blocks between host buffers and the cache. */
typedef struct kvcm_engine kvcm_engine;

/* The answer of one lookup (opaque; read it with the accessors below). */
typedef struct kvcm_locations kvcm_locations;

/* A string borrowed from a kvcm_locations: `len` bytes of UTF-8, then a NUL byte. */
typedef struct kvcm_str {
    const char *ptr;
    size_t len;
} kvcm_str;

/*
 * A whole result as flat arrays, borrowed from it (for bindings that decode in one pass).
 * Location i has types[i], spec_sizes[i] and the specs spec_starts[i] .. spec_starts[i+1]-1.
 * Spec s has its name at string 2s and its URI at string 2s+1. String k starts at
 * strings + string_offsets[k] and is string_offsets[k+1] - string_offsets[k] - 1 bytes long;
 * a NUL byte follows each string, so strings_len counts 2 * spec_total NULs.
 */
typedef struct kvcm_flat_view {
    size_t count;                  /* locations */
    const int32_t *types;          /* count entries */
    const int32_t *spec_sizes;     /* count entries */
    const size_t *spec_starts;     /* count + 1 entries */
    size_t spec_total;             /* specs over all locations */
    const size_t *string_offsets;  /* 2 * spec_total + 1 entries */
    const char *strings;           /* every name and URI back to back, each NUL-terminated */
    size_t strings_len;            /* bytes in strings, the NULs included */
} kvcm_flat_view;

/* The fast path's counters (a snapshot). */
typedef struct kvcm_fast_path_metrics {
    uint64_t hits;               /* lookups the fast path answered */
    uint64_t fallbacks;          /* lookups answered by gRPC instead */
    uint64_t retries;            /* copies read again (torn buckets, retired generations) */
    uint64_t extra_round_trips;  /* round trips beyond the first */
    uint64_t reconnects;         /* fast-path connections made after the first */
} kvcm_fast_path_metrics;

/*
 * TLS towards servers that serve it (kvcm.tls.* on the server; docs/security.md), for
 * kvcm_client_connect_tls and kvcm_engine_connect_with. Each field is a NUL-terminated path of a PEM file, read while
 * connecting (the struct and its strings need not outlive the call).
 * ca_file: the CA the servers' certificates chain to (required).
 * cert_file, key_file: the client's certificate and private key for mutual TLS (servers with
 * kvcm.tls.client_ca_file); both or neither (NULL).
 * server_name: the name the servers' certificates must carry (NULL: "localhost").
 * gRPC and the fast path's bootstrap speak TLS; the fast path's queue pairs do not.
 */
typedef struct kvcm_tls {
    const char *ca_file;
    const char *cert_file;
    const char *key_file;
    const char *server_name;
} kvcm_tls;

/* Version of this ABI (1). */
uint32_t kvcm_abi_version(void);

/*
 * Connects a client for `instance_id`.
 * grpc: the gRPC endpoint, "http://host:port" or "host:port"; http: the server's meta HTTP
 * address "ip:port" (used to bootstrap the fast path). Both may be comma-separated lists of
 * the same length for failover (tried in order).
 * wire: KVCM_WIRE_NONE, KVCM_WIRE_SOFT_TCP, KVCM_WIRE_SOFT_SHM or KVCM_WIRE_VERBS.
 * Does not fail when the servers are down (lookups then return KVCM_E_UNREACHABLE); when the
 * fast path cannot be set up, lookups use gRPC and the client retries the fast path later.
 * On success *client_out is a new client (free it with kvcm_client_free).
 */
int32_t kvcm_client_connect(const char *grpc, const char *http, const char *instance_id,
                            int32_t wire, kvcm_client **client_out, char **error_message);

/*
 * As kvcm_client_connect, with an API key (NULL: none) that every call carries: gRPC
 * `authorization` metadata and the fast path's bootstrap (servers with kvcm.auth.meta =
 * required; docs/security.md). A call the server refuses for its key fails with
 * KVCM_E_UNAUTHORIZED.
 */
int32_t kvcm_client_connect_with_key(const char *grpc, const char *http, const char *instance_id,
                                     int32_t wire, const char *api_key, kvcm_client **client_out,
                                     char **error_message);

/*
 * As kvcm_client_connect_with_key, over TLS when `tls` is not NULL (NULL: plaintext, exactly
 * kvcm_client_connect_with_key). With TLS a "host:port" gRPC endpoint means
 * "https://host:port"; an "http://" one is refused (KVCM_E_INVALID_ARGUMENT), as is
 * "https://" without TLS. The PEM files are read and checked here: a NULL ca_file is
 * KVCM_E_NULL_ARGUMENT, a cert_file without key_file (or the other way round), an unreadable
 * file, a file without a usable PEM or a bad server_name is KVCM_E_INVALID_ARGUMENT, the
 * message naming the field ("tls.ca_file", "tls.cert_file", ...). A server that refuses the
 * handshake (no client certificate, one of another CA) makes the calls fail like an
 * unreachable one (KVCM_E_UNREACHABLE), as does a plaintext client of a TLS server.
 */
int32_t kvcm_client_connect_tls(const char *grpc, const char *http, const char *instance_id,
                                int32_t wire, const char *api_key, const kvcm_tls *tls,
                                kvcm_client **client_out, char **error_message);

/* Frees a client (NULL: no-op). No call on it may be in flight. */
void kvcm_client_free(kvcm_client *client);

/*
 * Lookups over `count` block keys. On success *out is a new result (free it with
 * kvcm_locations_free); an unknown instance gives the server's code 8 (INSTANCE_NOT_EXIST).
 */
int32_t kvcm_prefix_match(const kvcm_client *client, const int64_t *keys, size_t count,
                          kvcm_locations **out, char **error_message);
int32_t kvcm_batch_get(const kvcm_client *client, const int64_t *keys, size_t count,
                       kvcm_locations **out, char **error_message);
/* Reverse rolling sliding-window match with a window of `sw_size` blocks. */
int32_t kvcm_sliding_window(const kvcm_client *client, const int64_t *keys, size_t count,
                            int32_t sw_size, kvcm_locations **out, char **error_message);

/* Copies the fast-path counters into *out. KVCM_E_NULL_ARGUMENT for a NULL argument. */
int32_t kvcm_client_metrics(const kvcm_client *client, kvcm_fast_path_metrics *out);

/* 1 when lookups currently use the fast path, 0 when not, KVCM_E_NULL_ARGUMENT for NULL. */
int32_t kvcm_client_fast_path_up(const kvcm_client *client);

/*
 * Read reports (off by default): with `on` != 0 the lookups the fast path answers are
 * reported to the server in batches (every 4,096 keys or 100 ms, checked at each lookup, and
 * when the client is freed), so that its reclaimer, event log and capacity curves count
 * them as reads. KVCM_E_NULL_ARGUMENT for NULL.
 */
int32_t kvcm_client_set_read_reports(const kvcm_client *client, int32_t on);

/*
 * Reports the lookups not reported yet, then copies how many lookups the server has
 * acknowledged counting (*reported) and how many reports were lost (*unreported: fast path
 * down, server not leader or busy; never retried). KVCM_E_NULL_ARGUMENT for NULL.
 */
int32_t kvcm_client_flush_read_reports(const kvcm_client *client, uint64_t *reported,
                                       uint64_t *unreported);

/*
 * Connects a transfer engine for `instance_id` (arguments as kvcm_client_connect); `wire` is
 * used for lookups and pool nodes (KVCM_WIRE_NONE: lookups over gRPC, pools over soft-TCP).
 * On success *engine_out is a new engine (free it with kvcm_engine_free).
 */
int32_t kvcm_engine_connect(const char *grpc, const char *http, const char *instance_id,
                            int32_t wire, kvcm_engine **engine_out, char **error_message);

/*
 * As kvcm_engine_connect, with an API key (NULL: none) and over TLS when `tls` is not NULL
 * (NULL: plaintext; both NULL: exactly kvcm_engine_connect). The key and the TLS settings
 * are those of kvcm_client_connect_tls, with the same codes for bad ones: the key goes with
 * the engine's gRPC calls and the fast path's bootstrap; with TLS, gRPC, the bootstrap and
 * the pool directory (where pool nodes are) speak TLS, the pool nodes' and the fast path's
 * queue pairs do not. A server that refuses the key makes puts and gets fail with
 * KVCM_E_UNAUTHORIZED; one that refuses the handshake (or a plaintext engine of a TLS server)
 * makes them fail with KVCM_E_UNREACHABLE.
 */
int32_t kvcm_engine_connect_with(const char *grpc, const char *http, const char *instance_id,
                                 int32_t wire, const char *api_key, const kvcm_tls *tls,
                                 kvcm_engine **engine_out, char **error_message);

/* Frees an engine (NULL: no-op). No call on it may be in flight. */
void kvcm_engine_free(kvcm_engine *engine);

/*
 * Stores `count` blocks of `specs` parts each under `keys`: part j of block i is the
 * lengths[i*specs+j] bytes at buffers[i*specs+j] (spec order of the instance; each length
 * must be its spec's size). Blocks already cached are left alone; the others are written and
 * committed with their checksums when every part was written. outcomes[i] gets a
 * KVCM_PUT_*, paths[i] (paths may be NULL) a KVCM_PATH_*. The call fails as a whole only when
 * the server cannot be asked (then no outcome is written).
 */
int32_t kvcm_engine_put(const kvcm_engine *engine, const int64_t *keys, size_t count,
                        size_t specs, const void *const *buffers, const size_t *lengths,
                        int32_t *outcomes, int32_t *paths, char **error_message);

/*
 * Reads the cached blocks of `keys` into the buffers (layout as kvcm_engine_put; buffers
 * must not overlap: KVCM_E_INVALID_ARGUMENT). outcomes[i] gets a KVCM_GET_*; a block that is
 * not a hit leaves its buffers holding nothing valid. A block whose bytes fail their
 * checksum is KVCM_GET_UNREADABLE and is removed from the cache.
 */
int32_t kvcm_engine_get(const kvcm_engine *engine, const int64_t *keys, size_t count,
                        size_t specs, void *const *buffers, const size_t *lengths,
                        int32_t *outcomes, int32_t *paths, char **error_message);

/*
 * Registers `len` bytes at `addr` (the engine's KV buffers, pinned host memory) for
 * zero-copy transfers: buffers of later puts and gets lying inside it move between the
 * NIC and these bytes directly on soft-TCP and verbs (paths KVCM_PATH_*_ZERO_COPY); other
 * buffers are staged. File-tier blocks inside it move through io_uring registered buffers
 * where io_uring allows (still KVCM_PATH_FILE). Until kvcm_engine_deregister_memory of
 * `addr` returns or the engine is freed, the bytes must stay allocated and mapped to the
 * same pages (no munmap, mremap, MADV_DONTNEED or MAP_FIXED over them: verbs and io_uring
 * move data through the pages they pinned); no transfer outlives the call that started it.
 * KVCM_E_NULL_ARGUMENT for a NULL engine or addr; KVCM_E_INVALID_ARGUMENT for zero length
 * or a range overlapping a registered one (nothing changes).
 */
int32_t kvcm_engine_register_memory(const kvcm_engine *engine, void *addr, size_t len,
                                    char **error_message);

/*
 * Forgets the memory registered at `addr`; its bytes may be freed once this returns.
 * KVCM_E_INVALID_ARGUMENT when no registered range starts at `addr`.
 */
int32_t kvcm_engine_deregister_memory(const kvcm_engine *engine, const void *addr,
                                      char **error_message);

/*
 * The directories the engine's file-tier blocks must lie under (the storages' mounts) for
 * later puts and gets; `count` 0 allows any path outside the system directories (the
 * default). The server names every file an engine reads and writes: list the mounts so that
 * no server can aim the engine elsewhere (a block outside them fails, as one in a system
 * directory always does). Symlinks in a root are resolved. KVCM_E_NULL_ARGUMENT for a NULL
 * engine, a NULL `roots` with `count` > 0 or a NULL root; KVCM_E_INVALID_UTF8 for a root that
 * is not UTF-8 and KVCM_E_INVALID_ARGUMENT for one that is not an absolute path (nothing
 * changes either way).
 */
int32_t kvcm_engine_set_file_roots(const kvcm_engine *engine, const char *const *roots,
                                   size_t count, char **error_message);

/* Number of locations in a result (0 for NULL). */
size_t kvcm_locations_count(const kvcm_locations *locations);

/*
 * Type, spec size and number of specs of location `index` (each output may be NULL).
 * KVCM_E_OUT_OF_RANGE when index >= count, KVCM_E_NULL_ARGUMENT for a NULL result.
 */
int32_t kvcm_location_get(const kvcm_locations *locations, size_t index, int32_t *type_out,
                          int32_t *spec_size_out, size_t *spec_count_out);

/*
 * Name and URI of spec `spec` of location `index`, borrowed from the result (both outputs
 * required). KVCM_E_OUT_OF_RANGE for a bad index; nothing is written on failure.
 */
int32_t kvcm_location_spec(const kvcm_locations *locations, size_t index, size_t spec,
                           kvcm_str *name_out, kvcm_str *uri_out);

/*
 * The writer's checksum (xxh3-64 of the part's bytes, kvcm's LocationSpec.checksum) of spec
 * `spec` of location `index`: *present_out = 1 and *checksum_out set when the block was
 * written with checksums, else both 0 (both outputs required). KVCM_E_OUT_OF_RANGE for a bad
 * index; nothing is written on failure.
 */
int32_t kvcm_location_spec_checksum(const kvcm_locations *locations, size_t index, size_t spec,
                                    uint64_t *checksum_out, int32_t *present_out);

/* The whole result as flat arrays (see kvcm_flat_view), borrowed from it. */
int32_t kvcm_locations_view(const kvcm_locations *locations, kvcm_flat_view *view_out);

/* Frees a result (NULL: no-op); every string and array borrowed from it becomes invalid. */
void kvcm_locations_free(kvcm_locations *locations);

/* Frees a string the library handed out (an error message; NULL: no-op). */
void kvcm_string_free(char *text);

#ifdef __cplusplus
}
#endif

#endif /* KVCM_H */
