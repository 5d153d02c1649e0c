/* What mprotect and madvise promise on heap memory, checked page by page: a write to a
 * PROT_READ page raises SIGSEGV and leaves the page as it was, a read of a PROT_NONE page
 * raises SIGSEGV, both work again after PROT_READ|PROT_WRITE, a forked child inherits the
 * protection; MADV_DONTNEED leaves zero pages, MADV_FREE leaves each page either as it was or
 * zero and keeps what is written afterwards. Every check runs on an anonymous mapping and on
 * malloc'd pages, after touching more memory than the ExCache holds (argument: MiB), so that
 * the pages have been evicted to an mComponent and back. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGES 64
#define PG 4096

static sigjmp_buf jump;
static volatile sig_atomic_t faults;

static void on_segv(int sig) {
    (void)sig;
    faults++;
    siglongjmp(jump, 1);
}

/* 1 if the access faulted. */
static int write_faults(volatile unsigned char *p, unsigned char v) {
    if (sigsetjmp(jump, 1)) return 1;
    *p = v;
    return 0;
}

static int read_faults(volatile unsigned char *p, unsigned char *out) {
    if (sigsetjmp(jump, 1)) return 1;
    *out = *p;
    return 0;
}

static void fill(unsigned char *a, unsigned char seed) {
    for (size_t i = 0; i < PAGES * PG; i++) a[i] = (unsigned char)(i / PG * 13 + seed);
}

static int page_is(const unsigned char *p, size_t page, unsigned char seed) {
    for (size_t i = 0; i < PG; i++)
        if (p[i] != (unsigned char)(page * 13 + seed)) return 0;
    return 1;
}

static int page_zero(const unsigned char *p) {
    for (size_t i = 0; i < PG; i++)
        if (p[i]) return 0;
    return 1;
}

/* Evicts the pages of `a` from the ExCache by touching `mib` MiB elsewhere (through a
 * volatile pointer: the compiler would drop stores to memory that is freed unread). */
static void pressure(size_t mib) {
    volatile unsigned char *b = malloc(mib << 20);
    for (size_t i = 0; i < mib << 20; i += PG) b[i] = (unsigned char)(i / PG + 1);
    free((void *)b);
}

static void check(const char *what, unsigned char *a, size_t mib) {
    unsigned char v;
    fill(a, 1);
    pressure(mib);

    /* mprotect */
    if (mprotect(a, 4 * PG, PROT_READ)) { printf("%s: mprotect: %m\n", what); return; }
    int wf = write_faults(a + PG + 5, 0xee);
    int rf = read_faults(a + PG + 5, &v);
    printf("%s: PROT_READ page: write %s, read %s, contents %s\n", what, wf ? "SIGSEGV" : "allowed", rf ? "SIGSEGV" : "allowed",
           page_is(a + PG, 1, 1) ? "kept" : "CHANGED");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(write_faults(a + 2 * PG, 1) ? 0 : 1);
    int st;
    waitpid(pid, &st, 0);
    printf("%s: forked child writing PROT_READ page: %s\n", what, WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "SIGSEGV" : "allowed");
    mprotect(a + 4 * PG, PG, PROT_NONE);
    pressure(mib);
    rf = read_faults(a + 4 * PG, &v);
    printf("%s: PROT_NONE page: read %s\n", what, rf ? "SIGSEGV" : "allowed");
    mprotect(a, 5 * PG, PROT_READ | PROT_WRITE);
    wf = write_faults(a + PG + 5, 0xee);
    rf = read_faults(a + 4 * PG + 7, &v);
    printf("%s: after PROT_READ|PROT_WRITE: write %s, read %s, value %s\n", what, wf ? "SIGSEGV" : "works", rf ? "SIGSEGV" : "works",
           a[PG + 5] == 0xee && v == (unsigned char)(4 * 13 + 1) ? "right" : "WRONG");

    /* MADV_DONTNEED: zero pages, also for pages that were only on an mComponent */
    fill(a, 2);
    pressure(mib);
    if (madvise(a + 8 * PG, 16 * PG, MADV_DONTNEED)) { printf("%s: MADV_DONTNEED: %m\n", what); return; }
    int zero = 1, kept = 1;
    for (size_t p = 8; p < 24; p++) zero &= page_zero(a + p * PG);
    for (size_t p = 24; p < PAGES; p++) kept &= page_is(a + p * PG, p, 2);
    printf("%s: MADV_DONTNEED: advised pages %s, others %s\n", what, zero ? "zero" : "NOT ZERO", kept ? "kept" : "CHANGED");

    /* MADV_FREE: each page as it was or zero; writes afterwards stay */
    fill(a, 3);
    pressure(mib);
    if (madvise(a + 32 * PG, 16 * PG, MADV_FREE)) { printf("%s: MADV_FREE: %m\n", what); return; }
    int ok = 1;
    for (size_t p = 32; p < 48; p++) ok &= page_is(a + p * PG, p, 3) || page_zero(a + p * PG);
    for (size_t p = 32; p < 48; p++) a[p * PG + 9] = (unsigned char)(p + 100);
    pressure(mib);
    int stays = 1;
    for (size_t p = 32; p < 48; p++) stays &= a[p * PG + 9] == (unsigned char)(p + 100);
    printf("%s: MADV_FREE: pages %s, later writes %s\n", what, ok ? "as they were or zero" : "GARBAGE", stays ? "stay" : "LOST");
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 16;
    struct sigaction sa = {.sa_handler = on_segv};
    sigaction(SIGSEGV, &sa, 0);
    unsigned char *m = mmap(0, PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 2;
    check("mmap", m, mib);
    unsigned char *h;
    if (posix_memalign((void **)&h, PG, PAGES * PG)) return 2;
    check("malloc", h, mib);
    printf("faults caught: %d\n", (int)faults);
    return 0;
}
