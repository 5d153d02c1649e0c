/* Threads increment counters in heap pages of their own while every step also misses on a
 * large buffer. Each page is read some steps before it is written, so under a small ExCache
 * it comes back clean, ages, and is often being evicted just as it is written. Each thread
 * then checks that its counters add up to the increments it made: a lost write shows as a
 * shortfall. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 3
#define HOT 16
static size_t cold_pages;
static long iters;
static unsigned char *cold;
static uint64_t *hot; /* HOT pages per thread */
static long lost[THREADS];

static void *work(void *arg) {
    size_t t = (size_t)arg;
    volatile uint64_t *mine = hot + t * HOT * 512;
    volatile unsigned char *c = cold;
    uint64_t x = 88172645463325252ull + t, sink = 0;
    for (long i = 0; i < iters; i++) {
        sink += mine[(i % HOT) * 512];
        mine[((i + HOT / 2) % HOT) * 512 + (i * 13) % 512] += 1;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t page = x % cold_pages;
        sink += c[page * 4096];
        if (i % 8 == 0) c[page * 4096 + 1] = 1;
    }
    uint64_t sum = 0;
    for (size_t k = 0; k < HOT * 512; k++) sum += mine[k];
    lost[t] = iters - (long)sum + (long)(sink & 0);
    return 0;
}

int main(int argc, char **argv) {
    cold_pages = (argc > 1 ? strtoul(argv[1], 0, 10) : 8) * 256;
    iters = argc > 2 ? atol(argv[2]) : 20000;
    cold = calloc(cold_pages, 4096);
    hot = calloc(THREADS * HOT, 4096);
    pthread_t th[THREADS];
    for (size_t t = 0; t < THREADS; t++) pthread_create(&th[t], 0, work, (void *)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], 0);
    long total = 0;
    for (int t = 0; t < THREADS; t++) total += lost[t];
    size_t marked = 0;
    for (size_t p = 0; p < cold_pages; p++) marked += cold[p * 4096 + 1];
    printf("%d threads, %ld increments each, lost %ld, %zu pages marked\n", THREADS, iters, total, marked);
    return total != 0;
}
