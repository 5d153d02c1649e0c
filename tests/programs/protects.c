/* Changes the protection of parts of one heap mapping `n` times, as a JIT flips its code pages
 * between writable and executable: every mprotect is a heap call that the process's home
 * mComponent answers. A part made writable again is written, one made read-only is read.
 * Prints a checksum. protects N */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define PARTS 64
#define PART (64 << 10)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    unsigned char *p = mmap(0, PARTS * PART, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    unsigned long sum = 0;
    for (int i = 0; i < n; i++) {
        unsigned char *part = p + (size_t)(i % PARTS) * PART;
        int writable = (i / PARTS) % 2 == 0;
        if (mprotect(part, PART, writable ? PROT_READ | PROT_WRITE : PROT_READ) != 0) {
            perror("mprotect");
            return 1;
        }
        if (writable)
            part[i % PART] = (unsigned char)i;
        sum = sum * 31 + part[i % PART];
    }
    printf("sum %lu\n", sum);
    return 0;
}
