/* Touches a working set several times larger than the ExCache and checks every byte:
 * sequential writes, a read pass, random read-modify-writes, then a checksum.
 * memtouch [MiB [RANDOM]]: RANDOM read-modify-writes (200000 by default; 0: scans only). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    long rmw = argc > 2 ? strtol(argv[2], 0, 10) : 200000;
    size_t n = mb << 20;
    unsigned char *a = malloc(n);
    if (!a) { perror("malloc"); return 2; }
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 7 + 3);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i += 64) sum += a[i];
    uint64_t x = 88172645463325252ull;
    for (long k = 0; k < rmw; k++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t i = x % n;
        a[i] = (unsigned char)(a[i] + 1);
    }
    for (size_t i = 0; i < n; i++) sum = sum * 31 + a[i];
    int *z = calloc(1 << 20, sizeof(int));
    for (int i = 0; i < (1 << 20); i++) if (z[i]) { printf("calloc not zero at %d\n", i); return 3; }
    printf("mb=%zu checksum=%llu\n", mb, (unsigned long long)sum);
    free(z);
    free(a);
    return 0;
}
