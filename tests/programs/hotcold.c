/* A hot set written again and again while a cold stream passes through: an eviction
 * policy that sees references keeps the hot set, FIFO does not. Prints only a checksum, so
 * output is the same under any policy; the counters differ. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t hot_pages = argc > 1 ? strtoul(argv[1], 0, 10) : 256;
    size_t cold_pages = argc > 2 ? strtoul(argv[2], 0, 10) : 8192;
    unsigned char *hot = malloc(hot_pages * 4096), *cold = malloc(cold_pages * 4096);
    uint64_t s = 0;
    for (size_t c = 0; c < cold_pages; c++) {
        cold[c * 4096] = (unsigned char)c;
        for (size_t h = 0; h < hot_pages; h += 8) hot[((c + h) % hot_pages) * 4096] += 1;
    }
    for (size_t h = 0; h < hot_pages; h++) s += hot[h * 4096];
    for (size_t c = 0; c < cold_pages; c++) s += cold[c * 4096];
    printf("checksum %llu\n", (unsigned long long)s);
    return 0;
}
