/*
 * A stand-in libcuda for counting vyre-cuda's own host work per dispatch on a
 * machine without a GPU (scripts/host-path). Every driver call the backend makes
 * returns success at once: device and pinned memory are host memory, copies and
 * fills are memcpy/memset, streams, events and contexts are tokens, a module only
 * counts its entry's parameters, and a launch does only what the result ABI's
 * epilogue does (writes the start and end stamps and copies the described ranges
 * into the result area), so a dispatch completes the way the backend checks it
 * does. Kernels do not run: outputs are whatever the buffers held. Use it to
 * measure the host path (callgrind instruction counts are repeatable on a shared
 * machine), never to test results. The tokenizer's device encode (its encode_host
 * bench, scripts/host-path --tokenizer) runs end to end here: its host-mapped
 * buffers are zeroed host memory no kernel writes, so every document's token count
 * reads 0 and each encode hands out no ids.
 *
 * A lane's server (the module whose entry is vyre_lane) is a host thread: it waits
 * for each ticket's doorbell (copy 0 of its slot), writes the first 8 KiB of the
 * slot's result area as flagged words carrying the ticket's flag (data 0, but the
 * header's ticket field), then the completion word, and leaves on a stop doorbell.
 * The lane's stream answers cuStreamQuery "not ready" until the thread has left. A
 * request reading back more than fits in 8 KiB of its area waits for its timeout;
 * VYRE_STUB_ANSWERED_BYTES sets another size (scripts/host-path --tokenizer: the
 * encode lane's 1 KiB text reads back a word per byte, 8.3 KiB of flagged words).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long u64;

static __thread void *current_context;
static int primary_context;

struct module {
    int parameters;
    int results; /* declares the result ABI's parameters (the raw floor's plain kernel does not) */
    int control; /* the index of the result ABI's first parameter (scalar parameters follow its five) */
    int lane;    /* its entry is a lane's server */
    u64 global;
};

/* codegen::ptx::lane: a doorbell's stop bit, the bytes of a doorbell copy, the
 * header's ticket word (the sixth data word). */
#define DOORBELL_STOP (1ull << 49)
#define DOORBELL_STRIDE 128
#define HEADER_TICKET_WORD 5
#define HOST_PLACEMENT 64
#define ANSWERED_AREA_BYTES 8192
#define CUDA_ERROR_NOT_READY 600

struct lane_server {
    pthread_t thread;
    atomic_int left;
    int joined;
    u64 completion, doorbells, areas;
    unsigned slots, area_stride, copies, answered;
};

/* A stream token: the lane server launched on it, if any. The special handles
 * (0, CU_STREAM_LEGACY 1, CU_STREAM_PER_THREAD 2) are not tokens. */
struct stream {
    struct lane_server *server;
};

static struct stream *token_of(void *stream) {
    return (uintptr_t)stream < 4096 ? 0 : stream;
}

static void *serve(void *argument) {
    struct lane_server *s = argument;
    for (u64 ticket = 0;; ticket++) {
        unsigned want = (unsigned)(ticket + 1);
        unsigned slot = (unsigned)(ticket % s->slots);
        _Atomic u64 *bell =
            (_Atomic u64 *)(uintptr_t)(s->doorbells + (u64)DOORBELL_STRIDE * s->copies * slot);
        u64 value;
        while ((unsigned)(value = atomic_load_explicit(bell, memory_order_acquire)) != want)
            __builtin_ia32_pause();
        if (value & DOORBELL_STOP) break;
        _Atomic u64 *area = (_Atomic u64 *)(uintptr_t)(s->areas + (u64)s->area_stride * slot);
        u64 flag = (u64)want << 32;
        unsigned words = s->area_stride < s->answered ? s->area_stride / 8 : s->answered / 8;
        for (unsigned i = 0; i < words; i++)
            atomic_store_explicit(&area[i], flag | (i == HEADER_TICKET_WORD ? want : 0),
                                  memory_order_relaxed);
        atomic_store_explicit((_Atomic u64 *)(uintptr_t)s->completion, want,
                              memory_order_release);
    }
    atomic_store(&s->left, 1);
    return 0;
}

/* The lane entry's parameters (codegen::ptx::lane::LANE_PARAMETERS): completion,
 * doorbells, records, areas, staging, candidates 1-3, device words (u64), then slots,
 * area stride, staging bytes, poll sleep, candidates (u32). The stand-in serves
 * through candidate 0 and, with several, says so where the host waits for the
 * choice. */
static int start_lane(void **parameters, void *stream) {
    struct stream *token = token_of(stream);
    if (!token || !parameters) return 1; /* CUDA_ERROR_INVALID_VALUE */
    struct lane_server *s = calloc(1, sizeof *s);
    if (!s) return 2;
    s->completion = *(u64 *)parameters[0];
    s->doorbells = *(u64 *)parameters[1];
    u64 records = *(u64 *)parameters[2];
    s->areas = *(u64 *)parameters[3];
    s->slots = *(unsigned *)parameters[9];
    s->area_stride = *(unsigned *)parameters[10];
    const char *answered = getenv("VYRE_STUB_ANSWERED_BYTES");
    s->answered = answered ? (unsigned)strtoul(answered, 0, 10) : ANSWERED_AREA_BYTES;
    if (*(unsigned *)parameters[13] > 1)
        atomic_store_explicit((_Atomic u64 *)(uintptr_t)(s->completion + HOST_PLACEMENT), 1,
                              memory_order_release);
    if (!s->slots) s->slots = 1;
    s->copies = (unsigned)((records - s->doorbells) / ((u64)DOORBELL_STRIDE * s->slots));
    if (!s->copies) s->copies = 1;
    if (pthread_create(&s->thread, 0, serve, s)) {
        free(s);
        return 2;
    }
    token->server = s;
    return 0;
}

/* Whether the stream's lane server has left (joined once it has); true without one. */
static int server_left(void *stream, int wait) {
    struct stream *token = token_of(stream);
    struct lane_server *s = token ? token->server : 0;
    if (!s) return 1;
    if (!wait && !atomic_load(&s->left)) return 0;
    if (!s->joined) {
        pthread_join(s->thread, 0);
        s->joined = 1;
    }
    return 1;
}

static void *zeroed(size_t bytes) {
    if (bytes > ((size_t)16 << 30)) return 0;
    size_t rounded = (bytes + 255) / 256 * 256;
    if (!rounded) rounded = 256;
    void *p = aligned_alloc(256, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

int cuInit(unsigned flags) { return 0; }
int cuDriverGetVersion(int *version) { *version = 12080; return 0; }
int cuDeviceGetCount(int *count) { *count = 1; return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int device) { strncpy(name, "stand-in", len); return 0; }
int cuDeviceGetAttribute(int *value, int attribute, int device) {
    switch (attribute) {
    case 1: *value = 1024; break;                           /* threads per block */
    case 2: case 3: *value = 1024; break;                   /* block x, y */
    case 4: *value = 64; break;                             /* block z */
    case 5: *value = 2147483647; break;                     /* grid x */
    case 6: case 7: *value = 65535; break;                  /* grid y, z */
    case 8: *value = 49152; break;                          /* shared per block */
    case 10: *value = 32; break;                            /* warp */
    case 16: *value = 132; break;                           /* SMs */
    case 39: *value = 2048; break;                          /* threads per SM */
    case 75: *value = 9; break; case 76: *value = 0; break; /* compute capability */
    case 97: *value = 232448; break;                        /* shared opt-in */
    default: *value = 1;                                    /* every capability flag */
    }
    return 0;
}
int cuDeviceTotalMem_v2(size_t *bytes, int device) { *bytes = (size_t)14 << 30; return 0; }
int cuDevicePrimaryCtxRetain(void **context, int device) { *context = &primary_context; return 0; }
int cuDevicePrimaryCtxRelease_v2(int device) { return 0; }
int cuDevicePrimaryCtxReset_v2(int device) { return 0; }
int cuCtxSetCurrent(void *context) { current_context = context; return 0; }
int cuCtxGetCurrent(void **context) { *context = current_context; return 0; }
int cuDeviceCanAccessPeer(int *can, int device, int peer) { *can = 0; return 0; }
int cuCtxEnablePeerAccess(void *context, unsigned flags) { return 0; }
int cuStreamCreate(void **stream, unsigned flags) {
    *stream = calloc(1, sizeof(struct stream));
    return *stream ? 0 : 2;
}
int cuStreamDestroy_v2(void *stream) {
    /* A server still serving (an abandoned lane) keeps its token. */
    if (token_of(stream) && server_left(stream, 0)) free(stream);
    return 0;
}
int cuStreamSynchronize(void *stream) {
    server_left(stream, 1);
    return 0;
}
int cuStreamWaitEvent(void *stream, void *event, unsigned flags) { return 0; }
int cuEventCreate(void **event, unsigned flags) { *event = malloc(16); return 0; }
int cuEventDestroy_v2(void *event) { free(event); return 0; }
int cuEventRecord(void *event, void *stream) { return 0; }
int cuEventElapsedTime(float *ms, void *start, void *end) { *ms = 0.001f; return 0; }
int cuMemAlloc_v2(u64 *pointer, size_t bytes) {
    void *p = zeroed(bytes);
    if (!p) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *pointer = (u64)(uintptr_t)p;
    return 0;
}
int cuMemFree_v2(u64 pointer) { free((void *)(uintptr_t)pointer); return 0; }
int cuMemHostAlloc(void **pointer, size_t bytes, unsigned flags) {
    void *p = zeroed(bytes);
    if (!p) return 2;
    *pointer = p;
    return 0;
}
int cuMemHostGetDevicePointer_v2(u64 *device, void *host, unsigned flags) {
    *device = (u64)(uintptr_t)host;
    return 0;
}
int cuMemFreeHost(void *pointer) { free(pointer); return 0; }
int cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    *free_bytes = (size_t)12 << 30;
    *total = (size_t)14 << 30;
    return 0;
}
int cuMemcpyHtoDAsync_v2(u64 dst, const void *src, size_t n, void *stream) {
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
int cuMemcpyDtoHAsync_v2(void *dst, u64 src, size_t n, void *stream) {
    memcpy(dst, (void *)(uintptr_t)src, n);
    return 0;
}
int cuMemcpyAsync(u64 dst, u64 src, size_t n, void *stream) {
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return 0;
}
int cuMemcpyDtoH_v2(void *dst, u64 src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return 0; }
int cuMemcpyHtoD_v2(u64 dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return 0; }
int cuMemsetD8Async(u64 dst, unsigned char value, size_t n, void *stream) {
    memset((void *)(uintptr_t)dst, value, n);
    return 0;
}
int cuMemsetD32Async(u64 dst, unsigned value, size_t n, void *stream) {
    unsigned *words = (unsigned *)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) words[i] = value;
    return 0;
}
int cuModuleLoadData(void **module, const void *image) {
    struct module *m = calloc(1, sizeof *m);
    const char *entry = strstr(image, ".entry");
    const char *end = entry ? strstr(entry, "\n)") : 0;
    const char *control = entry ? strstr(entry, "vyre_control") : 0;
    m->results = control && end && control < end;
    for (const char *p = entry; p && end && (p = strstr(p, ".param .")) && p < end; p++) {
        if (m->results && p < control) m->control = m->parameters;
        m->parameters++;
    }
    m->lane = entry && strncmp(entry, ".entry vyre_lane(", 17) == 0;
    m->global = (u64)(uintptr_t)zeroed(64);
    *module = m;
    return 0;
}
int cuModuleUnload(void *module) { return 0; }
int cuModuleGetFunction(void **function, void *module, const char *name) { *function = module; return 0; }
int cuModuleGetGlobal_v2(u64 *pointer, size_t *bytes, void *module, const char *name) {
    *pointer = ((struct module *)module)->global;
    if (bytes) *bytes = 64;
    return 0;
}
/* The result ABI's five parameters: control, results, flags, range count,
 * descriptors (see codegen::ptx), after the buffers' and before the scalars'. */
static int epilogue(void *function, void **parameters) {
    struct module *m = function;
    int at = m->control;
    if (!m->results || at + 5 > m->parameters || !parameters) return 0;
    u64 results = *(u64 *)parameters[at + 1];
    unsigned flags = *(unsigned *)parameters[at + 2];
    unsigned count = *(unsigned *)parameters[at + 3];
    u64 *ranges = (u64 *)parameters[at + 4];
    u64 *stamps = (u64 *)(uintptr_t)results;
    if (flags & 1) stamps[0] = 1000;
    if (flags & 2) stamps[1] = 2000;
    unsigned windows = (flags >> 8) & 0xff;
    for (unsigned i = 0; i < count; i++) {
        u64 source = ranges[2 * i], word = ranges[2 * i + 1];
        if (i < windows)
            memcpy((void *)(uintptr_t)word, (void *)(uintptr_t)source, 16);
        else
            memcpy((void *)(uintptr_t)(results + (word >> 32)), (void *)(uintptr_t)source,
                   (unsigned)word);
    }
    return 0;
}
int cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                   unsigned by, unsigned bz, unsigned shared, void *stream, void **parameters,
                   void **extra) {
    if (((struct module *)function)->lane) return start_lane(parameters, stream);
    return epilogue(function, parameters);
}
int cuLaunchCooperativeKernel(void *function, unsigned gx, unsigned gy, unsigned gz,
                              unsigned bx, unsigned by, unsigned bz, unsigned shared,
                              void *stream, void **parameters) {
    if (((struct module *)function)->lane) return start_lane(parameters, stream);
    return epilogue(function, parameters);
}
/* A kernel with dynamic shared memory opts in to it (the tokenizer's encoder
 * compiles some): accepted up to the opt-in limit (attribute 97 above). */
int cuFuncSetAttribute(void *function, int attribute, int value) {
    if (attribute == 8 && (value < 0 || value > 232448)) return 1; /* CUDA_ERROR_INVALID_VALUE */
    return 0;
}
/* Calls the backend makes only where the driver has them (the loading mode,
 * cuFuncLoad: every current driver does) or only for lanes (the last two):
 * loading is eager and finishes at once, a stream is always idle, an event reached. */
int cuModuleGetLoadingMode(int *mode) { *mode = 1; return 0; } /* CU_MODULE_EAGER_LOADING */
int cuFuncLoad(void *function) { return 0; }
int cuStreamQuery(void *stream) { return server_left(stream, 0) ? 0 : CUDA_ERROR_NOT_READY; }
int cuEventSynchronize(void *event) { return 0; }
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *function, int size,
                                                size_t shared) {
    *blocks = 8;
    return 0;
}
int cuGetErrorName(int error, const char **name) { *name = "CUDA_ERROR_STAND_IN"; return 0; }
