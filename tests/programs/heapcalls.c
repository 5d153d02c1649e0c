/* Maps, writes, reads and unmaps `n` heap mappings of 1 MiB one after another, as an allocator
 * does with its large blocks: every call is a heap call. Each new mapping must read as zeros.
 * Prints a checksum. heapcalls N [TOUCH]: with TOUCH 0 the mappings are not touched (heap
 * calls back to back). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    int touch = argc > 2 ? atoi(argv[2]) : 1;
    unsigned long sum = 0;
    for (int i = 0; i < n; i++) {
        unsigned char *p = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        size_t at = (size_t)(i % 256) * 4096;
        if (touch) {
            if (p[at] != 0) {
                printf("NOT ZERO at %d\n", i);
                return 1;
            }
            p[at] = (unsigned char)i;
        }
        sum = sum * 31 + (touch ? p[at] : (unsigned char)i);
        munmap(p, 1 << 20);
    }
    printf("sum %lu\n", sum);
    return 0;
}
