/* Heap mappings at address hints, as V8 asks for each of its 508 KiB pages: 64 hints 64 GiB
 * apart (upwards or downwards, where the address space has room). The data in each mapping
 * is kept wherever it was placed; a MAP_FIXED_NOREPLACE of a free address gets it. Prints one
 * line, then holds its mappings until its input ends. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define N 64
#define STEP (64ULL << 30)
#define LEN (508 << 10)

int main(void) {
    unsigned char *a = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    uintptr_t base = (uintptr_t)a;
    int down = base + (N + 2) * STEP > 0x7fffffffffffULL;
    unsigned char *m[N];
    for (int i = 0; i < N; i++) {
        uintptr_t hint = down ? base - (i + 1) * STEP : base + (i + 1) * STEP;
        m[i] = mmap((void *)hint, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m[i] == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        memset(m[i], i + 1, LEN);
    }
    int kept = 1;
    for (int i = 0; i < N; i++)
        kept &= m[i][0] == i + 1 && m[i][LEN - 1] == i + 1;
    uintptr_t at = down ? base - (N + 1) * STEP : base + (N + 1) * STEP;
    unsigned char *f = mmap((void *)at, LEN, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    printf("ready; %d mappings %s their data; MAP_FIXED_NOREPLACE: %s\n", N, kept ? "hold" : "LOST",
           f == (void *)at ? "at its address" : "ELSEWHERE");
    fflush(stdout);
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0)
        ;
    return 0;
}
