/* How long a program stalls when a component fails under it: fills MB MiB, says "ready",
 * then for SECS seconds reads and writes random pages, timing each access; prints JSON with
 * the number of accesses, the longest one and the 99.9th percentile.
 *   stall MB SECS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    size_t pages = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 8;
    double secs = argc > 2 ? atof(argv[2]) : 5;
    unsigned char *heap = malloc(pages * 4096);
    for (size_t p = 0; p < pages; p++) heap[p * 4096] = (unsigned char)p;
    printf("ready\n");
    fflush(stdout);
    size_t cap = 1 << 24, n = 0;
    uint32_t *lat = malloc(cap * sizeof *lat);
    uint64_t rng = 88172645463325252ull, end = now() + (uint64_t)(secs * 1e9), worst = 0, sum = 0;
    while (n < cap) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        size_t p = rng % pages;
        uint64_t a = now();
        unsigned char v = heap[p * 4096];
        heap[p * 4096] = (unsigned char)(v + 1);
        uint64_t d = now() - a;
        sum += v;
        lat[n++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
        if (d > worst) worst = d;
        if (a > end) break;
    }
    qsort(lat, n, sizeof *lat, cmp);
    printf("{\"accesses\": %zu, \"max_us\": %.1f, \"p999_us\": %.1f, \"p50_us\": %.2f, \"sum\": %llu}\n", n, worst / 1e3, lat[n * 999 / 1000] / 1e3, lat[n / 2] / 1e3, (unsigned long long)sum);
    return 0;
}
