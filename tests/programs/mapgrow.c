/* Maps COUNT private anonymous mappings of MIB MiB, one every DELAY_MS, each filled: a heap
 * that keeps growing into new memory while a test acts on the cluster. stdout: a checksum of
 * every mapping, the same natively. A mapping refused ends the program with the errno on
 * stderr. Usage: mapgrow COUNT MIB DELAY_MS */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: mapgrow COUNT MIB DELAY_MS\n"); return 2; }
    size_t count = strtoul(argv[1], 0, 10), len = strtoul(argv[2], 0, 10) << 20;
    long delay = strtol(argv[3], 0, 10);
    unsigned char **maps = calloc(count, sizeof *maps);
    if (!maps) { perror("calloc"); return 2; }
    for (size_t m = 0; m < count; m++) {
        maps[m] = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (maps[m] == MAP_FAILED) {
            fprintf(stderr, "mapping %zu refused: %s\n", m, strerror(errno));
            return 1;
        }
        memset(maps[m], (int)(m * 7 + 1), len);
        nanosleep(&(struct timespec){delay / 1000, (delay % 1000) * 1000000}, 0);
    }
    uint64_t sum = 0;
    for (size_t m = 0; m < count; m++)
        for (size_t i = 0; i < len; i += 4096) sum += maps[m][i] * (m + 1);
    printf("%zu mappings of %zu MiB, checksum %llu\n", count, len >> 20, (unsigned long long)sum);
    return 0;
}
