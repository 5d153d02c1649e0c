/* Reserves a large stretch of address space without memory behind it, as JVMs, V8 and Go do,
 * then commits a part of it, uses it and gives it back; prints what succeeded. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

int main(void) {
    size_t big = (size_t)1 << 40, part = (size_t)64 << 20;
    unsigned char *r = mmap(NULL, big, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    printf("1 TiB PROT_NONE reservation: %s\n", r == MAP_FAILED ? "failed" : "ok");
    if (r == MAP_FAILED) return 1;
    unsigned char *mid = r + big / 2;
    int rw = mprotect(mid, part, PROT_READ | PROT_WRITE);
    printf("64 MiB of it made writable: %s\n", rw ? "failed" : "ok");
    if (rw) return 1;
    for (size_t i = 0; i < part; i += 4096) mid[i] = (unsigned char)(i >> 12);
    uint64_t s = 0;
    for (size_t i = 0; i < part; i += 4096) s += mid[i];
    printf("sum %llu\n", (unsigned long long)s);
    printf("given back: %s\n", munmap(r, big) ? "failed" : "ok");
    /* Writable at once but MAP_NORESERVE: no memory is promised, pages come when touched. */
    unsigned char *w = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    printf("1 TiB writable MAP_NORESERVE: %s\n", w == MAP_FAILED ? "failed" : "ok");
    if (w == MAP_FAILED) return 1;
    for (size_t i = 0; i < big; i += big / 64) w[i] = 1;
    s = 0;
    for (size_t i = 0; i < big; i += big / 64) s += w[i];
    printf("64 pages across it touched: %llu\n", (unsigned long long)s);
    printf("given back: %s\n", munmap(w, big) ? "failed" : "ok");
    return 0;
}
