/* A hot set only read, over and over, between passes of a stream through a larger cold
 * area: the kernel's accessed bits would keep the hot set, an ExCache that sees only misses
 * and writes cannot tell it from the stream. Prints only a checksum, the same under any
 * policy; the counters differ.
 *     readhot HOT_PAGES COLD_PAGES ROUNDS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    size_t hot_pages = argc > 1 ? strtoul(argv[1], 0, 10) : 1024;
    size_t cold_pages = argc > 2 ? strtoul(argv[2], 0, 10) : 8192;
    int rounds = argc > 3 ? atoi(argv[3]) : 10;
    unsigned char *hot = malloc(hot_pages * 4096), *cold = malloc(cold_pages * 4096);
    for (size_t h = 0; h < hot_pages; h++) hot[h * 4096] = (unsigned char)h;
    for (size_t c = 0; c < cold_pages; c++) cold[c * 4096] = (unsigned char)(c * 7);
    uint64_t s = 0, x = 1, c = 0;
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < hot_pages * 4; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            s += hot[((x >> 33) % hot_pages) * 4096];
        }
        for (size_t i = 0; i < hot_pages / 2; i++, c++) s += cold[(c % cold_pages) * 4096];
    }
    printf("checksum %llu\n", (unsigned long long)s);
    return 0;
}
