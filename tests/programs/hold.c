/* Fills a heap buffer, says "ready", waits until its stdin closes, then reads the buffer back:
 * lets a test act on the cluster while the program's memory lives on mComponents. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t n = (argc > 1 ? strtoul(argv[1], 0, 10) : 16) << 20;
    unsigned char *a = malloc(n);
    /* Every page different: pages alike would make parity rows of zeros. */
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 31 + 7 + (i >> 12) * 101);
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s = s * 33 + a[i];
    printf("sum %llu\n", (unsigned long long)s);
    return 0;
}
