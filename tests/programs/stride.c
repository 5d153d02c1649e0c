/* Touches `count` pages exactly `stride_mb` MiB apart, `rounds` times: in a virtually indexed
 * cache of stride_mb MiB they all fall into one set. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    size_t stride = (argc > 1 ? strtoul(argv[1], 0, 10) : 16) << 20;
    int count = argc > 2 ? atoi(argv[2]) : 8, rounds = argc > 3 ? atoi(argv[3]) : 100;
    unsigned char *a = mmap(0, stride * count, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned long s = 0;
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < count; k++) { a[(size_t)k * stride] += 1; s += a[(size_t)k * stride]; }
    printf("sum %lu\n", s);
    return 0;
}
