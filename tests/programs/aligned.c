/* The aligned-allocation family and malloc_usable_size, as a program sees them from glibc:
 * which alignments each function accepts, the alignment it gives, errno on failure, and a
 * usable size at least the requested one. The blocks are written in full, so that they are
 * really backed where the heap lives. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *err(int e) {
    return e == 0 ? "0" : e == EINVAL ? "EINVAL" : e == ENOMEM ? "ENOMEM" : "other";
}

/* The largest power of two that divides the address (capped), so the output says what
 * alignment the block got without printing addresses. */
static int aligned_to(void *p, size_t a) {
    return a == 0 || ((uintptr_t)p & (a - 1)) == 0;
}

static int usable(void *p, size_t n) {
    if (!p) return 1;
    memset(p, 0x5c, n);
    return malloc_usable_size(p) >= n;
}

static void report(const char *fn, size_t align, size_t n, void *p, int e, size_t want_align) {
    if (p)
        printf("%s(%zu, %zu): block, aligned %s, usable %s\n", fn, align, n, aligned_to(p, want_align) ? "yes" : "NO",
               usable(p, n) ? "enough" : "TOO SMALL");
    else
        printf("%s(%zu, %zu): NULL, errno %s\n", fn, align, n, err(e));
    free(p);
}

int main(void) {
    const size_t aligns[] = {0, 1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64, 100, 256, 4096, 8192, 1 << 20, (size_t)1 << 40,
                             SIZE_MAX / 2 + 1, SIZE_MAX / 2 + 2, SIZE_MAX};
    const size_t sizes[] = {0, 1, 100, 5000, 1 << 20};
    size_t na = sizeof aligns / sizeof *aligns, ns = sizeof sizes / sizeof *sizes;
    for (size_t i = 0; i < na; i++) {
        size_t a = aligns[i];
        /* The alignment a block must have: the next power of two for the rounding functions. */
        size_t up = 1;
        while (up < a && up) up <<= 1;
        for (size_t j = 0; j < ns; j++) {
            size_t n = sizes[j];
            void *p = (void *)1;
            int r = posix_memalign(&p, a, n);
            if (r) printf("posix_memalign(%zu, %zu): %s, pointer %s\n", a, n, err(r), p == (void *)1 ? "untouched" : "CHANGED");
            else report("posix_memalign", a, n, p, 0, a);
            errno = 0;
            p = aligned_alloc(a, n);
            report("aligned_alloc", a, n, p, errno, up);
            errno = 0;
            p = memalign(a, n);
            report("memalign", a, n, p, errno, up);
        }
    }
    for (size_t j = 0; j < ns; j++) {
        errno = 0;
        void *p = valloc(sizes[j]);
        report("valloc", 4096, sizes[j], p, errno, 4096);
        p = pvalloc(sizes[j]);
        printf("pvalloc(%zu): aligned %s, usable %s\n", sizes[j], aligned_to(p, 4096) ? "yes" : "NO",
               p && malloc_usable_size(p) >= (sizes[j] + 4095) / 4096 * 4096 && usable(p, sizes[j]) ? "whole pages" : "TOO SMALL");
        free(p);
    }
    errno = 0;
    void *pv = pvalloc(SIZE_MAX);
    printf("pvalloc(SIZE_MAX): %s, errno %s\n", pv ? "block" : "NULL", err(errno));

    /* malloc_usable_size: at least what was asked, through growth and shrinking */
    int ok = 1;
    for (size_t n = 0; n < 20000; n += 7) {
        char *p = malloc(n);
        ok &= p && usable(p, n);
        free(p);
    }
    char *p = NULL;
    for (size_t n = 1; n < (64 << 20); n = n * 3 + 1) {
        p = realloc(p, n);
        ok &= p && usable(p, n);
    }
    for (size_t n = 64 << 20; n > 0; n /= 5) {
        p = realloc(p, n);
        ok &= p && usable(p, n);
    }
    free(p);
    printf("malloc_usable_size >= requested: %s; of NULL: %zu\n", ok ? "always" : "NOT ALWAYS", malloc_usable_size(NULL));

    /* failures: errno and NULL as glibc (volatile: the compiler must not judge the calls) */
    volatile size_t huge = SIZE_MAX, half = SIZE_MAX / 2;
    void *r;
    errno = 0;
    r = malloc(huge);
    printf("malloc(SIZE_MAX): %s, errno %s\n", r ? "block" : "NULL", err(errno));
    errno = 0;
    r = malloc(half);
    printf("malloc(SIZE_MAX/2): %s, errno %s\n", r ? "block" : "NULL", err(errno));
    errno = 0;
    r = calloc(half, 4);
    printf("calloc(SIZE_MAX/2, 4): %s, errno %s\n", r ? "block" : "NULL", err(errno));
    errno = 0;
    r = reallocarray(NULL, half, 4);
    printf("reallocarray(NULL, SIZE_MAX/2, 4): %s, errno %s\n", r ? "block" : "NULL", err(errno));
    p = malloc(10);
    errno = 0;
    r = realloc(p, 0);
    printf("realloc(p, 0): %s, errno %s\n", r ? "block" : "NULL", err(errno));
    p = realloc(NULL, 0);
    printf("realloc(NULL, 0): %s\n", p ? "block" : "NULL");
    free(p);
    errno = 0;
    p = malloc(0);
    printf("malloc(0): %s\n", p ? "block" : "NULL");
    free(p);
    errno = EBADF;
    free(malloc(100));
    printf("free keeps errno: %s\n", errno == EBADF ? "yes" : "NO");
    return 0;
}
