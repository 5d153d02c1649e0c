/* Allocates MIB MiB in blocks of 1 MiB as a server that waits for memory does: an allocation
 * that fails is tried again every 100 ms, for up to 60 s. stdout: a checksum of every block,
 * the same natively. stderr: "waiting for memory" once the first allocation fails, then how
 * many failed. Usage: growmem MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    unsigned char **blocks = calloc(mib, sizeof *blocks);
    if (!blocks) { perror("calloc"); return 2; }
    unsigned long failed = 0;
    for (size_t b = 0; b < mib; b++) {
        while (!(blocks[b] = malloc(1 << 20))) {
            if (failed++ == 0) {
                fprintf(stderr, "waiting for memory at %zu MiB\n", b);
                fflush(stderr);
            }
            if (failed > 600) { fprintf(stderr, "no memory came in 60 s\n"); return 1; }
            nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, 0);
        }
        memset(blocks[b], (int)(b * 7 + 1), 1 << 20);
    }
    uint64_t sum = 0;
    for (size_t b = 0; b < mib; b++)
        for (size_t i = 0; i < (1 << 20); i += 4096) sum += blocks[b][i] * (b + 1);
    printf("%zu MiB allocated, checksum %llu\n", mib, (unsigned long long)sum);
    fprintf(stderr, "allocations failed: %lu\n", failed);
    return 0;
}
