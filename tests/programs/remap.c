/* Heap mappings unmapped and mapped again, as allocators do with their arenas: every new
 * mapping reads as zeros, an unmapped range stays unmapped (mprotect fails with ENOMEM, a
 * forked child touching it gets SIGSEGV, MAP_FIXED_NOREPLACE may take it), written data
 * survives its neighbours' recycling. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define MB (1 << 20)

static int all(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++) if (p[i] != v) return 0;
    return 1;
}

static unsigned char *map(size_t n) {
    unsigned char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? 0 : p;
}

int main(void) {
    unsigned char *keep = map(MB);
    memset(keep, 0x11, MB);
    int zeros = 1, kept = 1;
    for (int round = 0; round < 200; round++) {
        unsigned char *a = map(MB);
        if (!a) { perror("mmap"); return 2; }
        zeros &= all(a, MB, 0);
        memset(a, round & 0xff ? round & 0xff : 1, MB);
        munmap(a, MB);
        kept &= all(keep, MB, 0x11);
    }
    printf("fresh mappings zero: %d, other data kept: %d\n", zeros, kept);

    unsigned char *b = map(MB);
    memset(b, 0x22, MB);
    munmap(b, MB);
    int r = mprotect(b, MB, PROT_READ);
    printf("mprotect of an unmapped range: %s\n", r == -1 && errno == ENOMEM ? "ENOMEM" : "ALLOWED");
    pid_t pid = fork();
    if (pid == 0) {
        volatile unsigned char c = b[100];
        (void)c;
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    printf("child touching an unmapped range: %s\n", WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV ? "SIGSEGV" : "NO FAULT");
    unsigned char *c = mmap(b, MB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    printf("MAP_FIXED_NOREPLACE on the unmapped range: %s, zero: %d\n", c == b ? "placed" : "REFUSED", c == b && all(c, MB, 0));
    unsigned char *d = map(2 * MB);
    memset(d, 0x33, 2 * MB);
    munmap(d + MB, MB);
    unsigned char *e = mremap(d, MB, 2 * MB, 0);
    printf("mremap growing into an unmapped tail: %s, data kept: %d\n", e == d ? "in place" : "REFUSED", e == d && all(d, MB, 0x33));
    return 0;
}
