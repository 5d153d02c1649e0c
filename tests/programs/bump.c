/* Bumps a counter in every page of a heap buffer, page after page, `rounds` times: each page is
 * read, then written. Prints a checksum. bump [MiB [ROUNDS]] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t pages = (argc > 1 ? strtoul(argv[1], 0, 10) : 16) * 256;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    uint64_t *a = malloc(pages * 4096);
    for (size_t i = 0; i < pages; i++) a[i * 512] = i;
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < pages; i++) a[i * 512] += a[i * 512] % 7 + r;
    uint64_t s = 0;
    for (size_t i = 0; i < pages; i++) s = s * 31 + a[i * 512];
    printf("%llu\n", (unsigned long long)s);
    return 0;
}
