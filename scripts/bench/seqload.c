/* LegoOS Figure 8 micro-benchmark: sequential 4 KB loads that all miss, timed one by one.
 *   seqload MB THREADS
 * Phase 1 writes every page once (first touches: p-local lines under splitos), phase 2 has
 * each thread load one byte of every page of its own slice in order. Prints JSON. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t pages_per_thread;
static unsigned char *heap;
static uint32_t *lat;  /* ns per access, phase 2 */
static uint32_t *first; /* ns per first touch, phase 1 */

static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

static void *load(void *arg) {
    size_t t = (size_t)arg;
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < pages_per_thread; i++) {
        size_t p = t * pages_per_thread + i;
        uint64_t a = now();
        sink += heap[p * 4096];
        lat[p] = (uint32_t)(now() - a);
    }
    (void)sink;
    return 0;
}

static int cmp(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void pct(const char *name, uint32_t *v, size_t n, int last) {
    qsort(v, n, sizeof *v, cmp);
    printf("\"%s\": {\"p50_ns\": %u, \"p99_ns\": %u}%s", name, v[n / 2], v[n * 99 / 100], last ? "" : ", ");
}

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? strtoul(argv[1], 0, 10) : 128;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    size_t pages = (mb << 20) / 4096;
    pages_per_thread = pages / threads;
    pages = pages_per_thread * threads;
    heap = aligned_alloc(4096, pages * 4096);
    lat = calloc(pages, sizeof *lat);
    first = calloc(pages, sizeof *first);
    for (size_t p = 0; p < pages; p++) {
        uint64_t a = now();
        heap[p * 4096] = (unsigned char)p;
        first[p] = (uint32_t)(now() - a);
    }
    pthread_t th[64];
    uint64_t t0 = now();
    for (int t = 0; t < threads; t++) pthread_create(&th[t], 0, load, (void *)(size_t)t);
    for (int t = 0; t < threads; t++) pthread_join(th[t], 0);
    double secs = (now() - t0) / 1e9;
    printf("{\"mb\": %zu, \"threads\": %d, \"pages\": %zu, \"load_mb_s\": %.1f, ", mb, threads, pages, pages * 4096.0 / 1048576.0 / secs);
    pct("load", lat, pages, 0);
    pct("first_touch", first, pages, 1);
    printf("}\n");
    return 0;
}
