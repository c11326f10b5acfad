/*
 * malloc_count: an LD_PRELOAD shim that counts, thread by thread, the C allocator's calls, and how
 * many allocations returned a block the same thread had freed shortly before (a proxy for glibc's
 * per-thread cache, "tcache", serving the allocation).
 *
 * Why: on the GPU machine the floor's pipelined speed depends on glibc's per-thread cache (with
 * GLIBC_TUNABLES=glibc.malloc.tcache_count=0 the floor loses its lead; BENCHMARKS.md, session 18),
 * and the NVIDIA driver allocates inside cuLaunchHostFunc. This shows how often each thread (the
 * launching thread, the driver's host-function thread, the reaper) allocates and frees per launch,
 * for the floor and for our launches. The benchmark's thread-costs section reads it through
 * `malloc_count_read` when the shim is preloaded:
 *
 *   LD_PRELOAD=gpu-bundle/lib/libmalloc_count.so BENCH_THREAD_COSTS=1 gpu-bundle/bin/bench_host_launch
 *
 * A diagnostic, never linked into the library. Built by scripts/gpu-bundle (gcc), checked there by
 * tools/malloc-count/check.c.
 *
 * How: every allocation function calls glibc's own (`__libc_malloc` and friends). Each thread
 * keeps, in initial-exec TLS (no allocation to reach it), its last RECENT freed blocks per size
 * class of 16 bytes below 1,008 usable bytes (about tcache's range); an allocation that returns one
 * of them counts as reused. Allocations, reuses and frees are also counted per size class. Counts live in a fixed table of THREADS entries, each written only by its own thread
 * (relaxed atomics, so another thread may read them at any time); threads beyond THREADS are not
 * counted.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

#define THREADS 256
#define CLASSES 64
#define RECENT 7

struct counts {
    long tid;                /* 0 while the entry is free; set once by its thread */
    unsigned long mallocs;   /* malloc, calloc, the memalign family, realloc of NULL */
    unsigned long frees;     /* free of a non-NULL pointer, realloc to 0 */
    unsigned long reused;    /* allocations that returned a block this thread freed recently */
    unsigned long reallocs;  /* realloc of a non-NULL pointer */
    /* The same by usable size, in classes of 16 bytes; the last class holds everything larger. */
    unsigned long mallocs_by_class[CLASSES];
    unsigned long reused_by_class[CLASSES];
    unsigned long frees_by_class[CLASSES];
};

static struct counts table[THREADS];
static unsigned long entries_taken;

#define TLS __thread __attribute__((tls_model("initial-exec")))
static TLS struct counts *mine;
static TLS int untracked;
static TLS void *recent[CLASSES][RECENT];
static TLS unsigned char next_recent[CLASSES];

static struct counts *self(void) {
    if (mine != NULL || untracked) {
        return mine;
    }
    unsigned long i = __atomic_fetch_add(&entries_taken, 1, __ATOMIC_RELAXED);
    if (i >= THREADS) {
        untracked = 1;
        return NULL;
    }
    mine = &table[i];
    __atomic_store_n(&mine->tid, (long)syscall(SYS_gettid), __ATOMIC_RELEASE);
    return mine;
}

static void add(unsigned long *counter) {
    __atomic_store_n(counter, __atomic_load_n(counter, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
}

/* The class of a block by its usable size: 16 bytes each, the last one open-ended. Blocks of the
 * last class are not remembered as recent frees (they are beyond glibc's thread cache). */
static int size_class(void *ptr) {
    size_t c = malloc_usable_size(ptr) / 16;
    return c < CLASSES ? (int)c : CLASSES - 1;
}

/* Counts an allocation that returned `ptr`, and whether it was one of this thread's recent frees. */
static void allocated(void *ptr) {
    struct counts *c = self();
    if (c == NULL || ptr == NULL) {
        return;
    }
    add(&c->mallocs);
    int k = size_class(ptr);
    add(&c->mallocs_by_class[k]);
    if (k == CLASSES - 1) {
        return;
    }
    for (int i = 0; i < RECENT; i++) {
        if (recent[k][i] == ptr) {
            recent[k][i] = NULL;
            add(&c->reused);
            add(&c->reused_by_class[k]);
            return;
        }
    }
}

/* Counts a free of `ptr` (before it is freed) and remembers it. */
static void freeing(void *ptr) {
    struct counts *c = self();
    if (c == NULL || ptr == NULL) {
        return;
    }
    add(&c->frees);
    int k = size_class(ptr);
    add(&c->frees_by_class[k]);
    if (k == CLASSES - 1) {
        return;
    }
    recent[k][next_recent[k]] = ptr;
    next_recent[k] = (unsigned char)((next_recent[k] + 1) % RECENT);
}

void *malloc(size_t size) {
    void *p = __libc_malloc(size);
    allocated(p);
    return p;
}

void free(void *ptr) {
    freeing(ptr);
    __libc_free(ptr);
}

void *calloc(size_t count, size_t size) {
    void *p = __libc_calloc(count, size);
    allocated(p);
    return p;
}

void *realloc(void *ptr, size_t size) {
    if (ptr == NULL) {
        return malloc(size);
    }
    if (size == 0) {
        free(ptr);
        return NULL;
    }
    struct counts *c = self();
    if (c != NULL) {
        add(&c->reallocs);
    }
    return __libc_realloc(ptr, size);
}

void *memalign(size_t alignment, size_t size) {
    void *p = __libc_memalign(alignment, size);
    allocated(p);
    return p;
}

void *aligned_alloc(size_t alignment, size_t size) {
    return memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) {
        return EINVAL;
    }
    void *p = memalign(alignment, size);
    if (p == NULL) {
        return ENOMEM;
    }
    *out = p;
    return 0;
}

void *valloc(size_t size) {
    return memalign((size_t)sysconf(_SC_PAGESIZE), size);
}

void *pvalloc(size_t size) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return memalign(page, (size + page - 1) / page * page);
}

/*
 * The counts of thread `tid` so far: out[0] allocations, out[1] frees, out[2] allocations that
 * reused a recent free of the same thread, out[3] reallocs. Returns 1 if the thread was seen (it
 * allocated or freed at least once), else 0 and leaves `out` alone.
 */
int malloc_count_read(long tid, unsigned long out[4]) {
    unsigned long taken = __atomic_load_n(&entries_taken, __ATOMIC_RELAXED);
    if (taken > THREADS) {
        taken = THREADS;
    }
    for (unsigned long i = 0; i < taken; i++) {
        if (__atomic_load_n(&table[i].tid, __ATOMIC_ACQUIRE) == tid) {
            out[0] = __atomic_load_n(&table[i].mallocs, __ATOMIC_RELAXED);
            out[1] = __atomic_load_n(&table[i].frees, __ATOMIC_RELAXED);
            out[2] = __atomic_load_n(&table[i].reused, __ATOMIC_RELAXED);
            out[3] = __atomic_load_n(&table[i].reallocs, __ATOMIC_RELAXED);
            return 1;
        }
    }
    return 0;
}

/* Thread `tid`'s counts per size class (CLASSES entries each: usable size [16k, 16k + 16) bytes,
 * the last class everything from 1,008 bytes up). Returns 1 if the thread was seen, else 0. */
int malloc_count_classes(long tid, unsigned long mallocs[CLASSES], unsigned long reused[CLASSES],
                         unsigned long frees[CLASSES]) {
    unsigned long taken = __atomic_load_n(&entries_taken, __ATOMIC_RELAXED);
    if (taken > THREADS) {
        taken = THREADS;
    }
    for (unsigned long i = 0; i < taken; i++) {
        if (__atomic_load_n(&table[i].tid, __ATOMIC_ACQUIRE) == tid) {
            for (int k = 0; k < CLASSES; k++) {
                mallocs[k] = __atomic_load_n(&table[i].mallocs_by_class[k], __ATOMIC_RELAXED);
                reused[k] = __atomic_load_n(&table[i].reused_by_class[k], __ATOMIC_RELAXED);
                frees[k] = __atomic_load_n(&table[i].frees_by_class[k], __ATOMIC_RELAXED);
            }
            return 1;
        }
    }
    return 0;
}
