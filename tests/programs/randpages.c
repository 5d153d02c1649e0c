/* Touches every page of a heap buffer in a random order (a fixed permutation), `rounds`
 * times, writing each: misses without any sequence. Prints a checksum. An optional third
 * argument pauses that many ms after each round: a job that misses steadily, not flat out. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t pages = (argc > 1 ? strtoul(argv[1], 0, 10) : 16) * 256;
    int rounds = argc > 2 ? atoi(argv[2]) : 2;
    unsigned pause_ms = argc > 3 ? strtoul(argv[3], 0, 10) : 0;
    unsigned char *a = malloc(pages * 4096);
    uint32_t *perm = malloc(pages * sizeof *perm);
    for (size_t i = 0; i < pages; i++) {
        perm[i] = i;
        a[i * 4096] = (unsigned char)i;
    }
    uint64_t x = 88172645463325252ull;
    for (size_t i = pages - 1; i > 0; i--) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t j = x % (i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    uint64_t s = 0;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < pages; i++) {
            s = s * 31 + a[(size_t)perm[i] * 4096];
            a[(size_t)perm[i] * 4096] ^= (unsigned char)r;
        }
        if (pause_ms)
            usleep(pause_ms * 1000);
    }
    printf("checksum %llu\n", (unsigned long long)s);
    return 0;
}
