/* Fills `mb` MiB of 12 KiB records, then reads one field of every record `passes` times: the
 * reads touch every third page, a strided stream that no next-line read-ahead follows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REC (3 * 4096)

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? strtoul(argv[1], 0, 10) : 24;
    int passes = argc > 2 ? atoi(argv[2]) : 3;
    size_t n = (mb << 20) / REC;
    unsigned char *a = malloc(n * REC);
    if (!a)
        return 1;
    for (size_t i = 0; i < n; i++)
        memset(a + i * REC, (int)(i * 7 + 1), REC);
    unsigned long s = 0;
    for (int p = 0; p < passes; p++)
        for (size_t i = 0; i < n; i++)
            s += a[i * REC + 64] * (unsigned long)(p + 1);
    printf("records %zu sum %lu\n", n, s);
    return 0;
}
