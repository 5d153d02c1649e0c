/* Memory new to the program reads zero; realloc, mremap and brk keep what they must. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int all(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++) if (p[i] != v) return 0;
    return 1;
}

int main(void) {
    size_t n = 8 << 20;
    unsigned char *c = calloc(n, 1);
    printf("calloc zero: %d\n", all(c, n, 0));
    memset(c, 1, n);
    free(c);
    c = calloc(n, 1);
    printf("calloc after free zero: %d\n", all(c, n, 0));
    free(c);

    unsigned char *m = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("fresh mmap zero: %d\n", all(m, n, 0));
    memset(m, 2, n);
    madvise(m, n / 2, MADV_DONTNEED);
    printf("after MADV_DONTNEED zero: %d, rest kept: %d\n", all(m, n / 2, 0), all(m + n / 2, n / 2, 2));
    memset(m, 3, n);
    unsigned char *r = mremap(m, n, 2 * n, MREMAP_MAYMOVE);
    printf("mremap kept: %d, grown part zero: %d\n", all(r, n, 3), all(r + n, n, 0));
    r = mremap(r, 2 * n, n / 2, 0);
    printf("mremap shrink kept: %d\n", all(r, n / 2, 3));
    munmap(r, n / 2);
    unsigned char *m2 = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("mmap after munmap zero: %d\n", all(m2, n, 0));
    memset(m2, 4, n);
    unsigned char *fx = mmap(m2, n / 4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    printf("MAP_FIXED over data zero: %d, rest kept: %d\n", fx == m2 && all(m2, n / 4, 0), all(m2 + n / 4, 3 * n / 4, 4));
    munmap(m2, n);

    unsigned char *p = malloc(1000);
    memset(p, 5, 1000);
    p = realloc(p, 10 << 20);
    printf("realloc kept: %d\n", all(p, 1000, 5));
    free(p);

    unsigned char *b = sbrk(0);
    if (sbrk(1 << 20) == (void *)-1) { printf("sbrk failed\n"); return 1; }
    printf("sbrk zero: %d\n", all(b, 1 << 20, 0));
    memset(b, 6, 1 << 20);
    sbrk(-(1 << 19));
    sbrk(1 << 19);
    printf("brk shrink then grow zero: %d, kept: %d\n", all(b + (1 << 19), 1 << 19, 0), all(b, 1 << 19, 6));
    return 0;
}
