/*
 * Checks libmalloc_count.so (run by scripts/gpu-bundle with the shim preloaded): a thread's
 * allocations, frees and reuses of its own recent frees are counted for that thread, in total and
 * in the blocks' size class, frees by another thread for the other thread, and malloc_count_read
 * and malloc_count_classes find them. Exit status 0 if so.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define BLOCKS 8

typedef int (*read_fn)(long, unsigned long[4]);

static void *blocks[BLOCKS];
static long other_tid;

static void *free_them(void *unused) {
    (void)unused;
    other_tid = (long)syscall(SYS_gettid);
    for (int i = 0; i < BLOCKS; i++) {
        free(blocks[i]);
    }
    return NULL;
}

int main(void) {
    read_fn read_counts = (read_fn)dlsym(RTLD_DEFAULT, "malloc_count_read");
    if (read_counts == NULL) {
        fprintf(stderr, "malloc_count check: the shim is not preloaded\n");
        return 1;
    }
    long me = (long)syscall(SYS_gettid);
    unsigned long before[4] = {0, 0, 0, 0};
    read_counts(me, before);

    /* Allocate, free, allocate again: glibc's thread cache hands the freed blocks back. */
    void *first[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        first[i] = malloc(64);
    }
    for (int i = 0; i < BLOCKS; i++) {
        free(first[i]);
    }
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = malloc(64);
    }
    int k = (int)(malloc_usable_size(blocks[0]) / 16);
    unsigned long after[4];
    if (!read_counts(me, after)) {
        fprintf(stderr, "malloc_count check: the main thread was not counted\n");
        return 1;
    }
    unsigned long mallocs = after[0] - before[0];
    unsigned long frees = after[1] - before[1];
    unsigned long reused = after[2] - before[2];

    /* Another thread frees this thread's blocks: counted for it. */
    pthread_t t;
    if (pthread_create(&t, NULL, free_them, NULL) != 0 || pthread_join(t, NULL) != 0) {
        fprintf(stderr, "malloc_count check: no thread\n");
        return 1;
    }
    unsigned long other[4];
    int seen = read_counts(other_tid, other);

    /* The same by size class: the blocks' class got all of the main thread's counts above. */
    typedef int (*classes_fn)(long, unsigned long *, unsigned long *, unsigned long *);
    classes_fn read_classes = (classes_fn)dlsym(RTLD_DEFAULT, "malloc_count_classes");
    unsigned long by_class[3][64];
    if (read_classes == NULL || !read_classes(me, by_class[0], by_class[1], by_class[2])) {
        fprintf(stderr, "malloc_count check: no counts by size class\n");
        return 1;
    }
    if (by_class[0][k] < 2 * BLOCKS || by_class[1][k] < 1 || by_class[2][k] < BLOCKS) {
        fprintf(stderr, "malloc_count check: class %d: %lu allocations, %lu reused, %lu frees\n", k,
                by_class[0][k], by_class[1][k], by_class[2][k]);
        return 1;
    }

    printf("malloc_count check: main thread %lu allocations, %lu frees, %lu reused; "
           "other thread seen %d, %lu frees\n",
           mallocs, frees, reused, seen, seen ? other[1] : 0);
    if (mallocs < 2 * BLOCKS || frees < BLOCKS || reused < 1 || !seen || other[1] < BLOCKS) {
        fprintf(stderr, "malloc_count check: counts are off\n");
        return 1;
    }
    return 0;
}
