/* Reads every page of a heap buffer in a random order, `rounds` times, and rewrites three in
 * four of the pages it reads: most reads are followed by a write, some are not. Prints a
 * checksum. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t pages = (argc > 1 ? strtoul(argv[1], 0, 10) : 16) * 256;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    unsigned char *a = malloc(pages * 4096);
    uint32_t *perm = malloc(pages * sizeof *perm);
    for (size_t i = 0; i < pages; i++) {
        perm[i] = i;
        a[i * 4096 + i % 4096] = (unsigned char)i;
    }
    uint64_t x = 2463534242ull, s = 0;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = pages - 1; i > 0; i--) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t j = x % (i + 1);
            uint32_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (size_t i = 0; i < pages; i++) {
            unsigned char *p = a + (size_t)perm[i] * 4096;
            s = s * 31 + p[perm[i] % 4096] + p[4095];
            if ((perm[i] + r) % 4 != 3)
                p[(perm[i] + r) % 4096] += (unsigned char)(r + 1);
        }
    }
    for (size_t i = 0; i < pages * 4096; i += 512) s = s * 31 + a[i];
    printf("checksum %llu\n", (unsigned long long)s);
    return 0;
}
