/* Threads rewrite whole heap pages again and again while they miss on each other's pages,
 * and all of them count into shared counters: under a small ExCache pages are evicted while
 * another thread is writing them. At the end every page must hold its last round's pattern
 * and the counters the number of increments made; a lost write shows as "bad" words. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 3
#define COUNTERS 64
static size_t pages;
static int rounds;
static uint64_t *heap;
static uint64_t *counters; /* one counter per page, COUNTERS pages */
static uint64_t increments[THREADS];

static uint64_t word(size_t page, int round, size_t k) {
    return ((uint64_t)page << 32) ^ ((uint64_t)round << 20) ^ k;
}

static void *work(void *arg) {
    size_t t = (size_t)arg;
    uint64_t x = 88172645463325252ull + t;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = t; i < pages; i += THREADS) {
            uint64_t *p = heap + i * 512;
            for (size_t k = 0; k < 512; k++) p[k] = word(i, r, k);
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            /* A page of another thread, read, and a shared counter, written atomically. */
            size_t other = x % pages;
            (void)((volatile uint64_t *)heap)[other * 512];
            __atomic_fetch_add(&counters[(x >> 20) % COUNTERS * 512], 1, __ATOMIC_RELAXED);
            increments[t]++;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    pages = (argc > 1 ? strtoul(argv[1], 0, 10) : 12) * 256;
    rounds = argc > 2 ? atoi(argv[2]) : 3;
    heap = malloc(pages * 4096);
    counters = calloc(COUNTERS, 4096);
    pthread_t th[THREADS];
    for (size_t t = 0; t < THREADS; t++) pthread_create(&th[t], 0, work, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], 0);
    size_t bad = 0;
    for (size_t i = 0; i < pages; i++)
        for (size_t k = 0; k < 512; k++) bad += heap[i * 512 + k] != word(i, rounds - 1, k);
    uint64_t counted = 0, made = 0;
    for (int c = 0; c < COUNTERS; c++) counted += counters[c * 512];
    for (int t = 0; t < THREADS; t++) made += increments[t];
    printf("pages %zu bad words %zu counters %s\n", pages, bad, counted == made ? "match" : "MISMATCH");
    return bad != 0 || counted != made;
}
