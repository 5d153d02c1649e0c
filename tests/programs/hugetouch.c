/* Fills a heap buffer of N MiB, reads it back in a random order R times and prints a
 * checksum. On stderr: how much of its memory is mapped with huge pages (from smaps), which
 * differs between native runs and runs under splitos by design. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t n = (argc > 1 ? strtoul(argv[1], 0, 10) : 64) << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 4;
    unsigned char *a = malloc(n);
    for (size_t i = 0; i < n; i += 64)
        a[i] = (unsigned char)(i >> 12);
    uint64_t s = 0, x = 88172645463325252ull;
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < n / 64; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s += a[(x % n) & ~(size_t)63];
        }
    printf("checksum %llu\n", (unsigned long long)s);
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    unsigned long kb, huge = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "ShmemPmdMapped: %lu", &kb) == 1 || sscanf(line, "FilePmdMapped: %lu", &kb) == 1 || sscanf(line, "AnonHugePages: %lu", &kb) == 1)
            huge += kb;
    fprintf(stderr, "huge-mapped %lu kB\n", huge);
    return 0;
}
