/* The cost of a program's first touches of new memory, natively and under the cheapest
 * userfaultfd pager of a shared memfd there can be (scripts/bench/pagerfloor.py times it).
 *
 *   firsttouch MODE MIB [WINDOW]
 *
 * MODE: anon   private anonymous memory (what a program's heap is natively);
 *       shmem  a shared mapping of a memfd (what a heap must be for a pager to read and punch
 *              its pages), filled by the kernel on each first touch;
 *       uffd   the same memfd registered with a userfaultfd, whose handler thread answers each
 *              first touch with WINDOW pages of zeros in one UFFDIO_COPY (splitos's
 *              fault-around and pre-allocation, without its bookkeeping).
 * Writes one byte to every page in order (timed), then checks every page holds it, and prints
 * {"mode", "pages", "s", "faults", "sum"} as JSON. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define PAGE 4096UL

static char *base;
static size_t pages, window;
static int uffd = -1;
static long faults;
static char *zeros;

/* Installs `n` zero pages at page `first`; a page already there (EEXIST) is skipped. */
static void install(size_t first, size_t n) {
    struct uffdio_copy c = {.dst = (uint64_t)(base + first * PAGE), .src = (uint64_t)zeros, .len = n * PAGE};
    if (ioctl(uffd, UFFDIO_COPY, &c) == 0)
        return;
    if (errno != EEXIST)
        die("UFFDIO_COPY");
    size_t done = c.copy > 0 ? (size_t)c.copy / PAGE : 0;
    for (size_t p = first + done; p < first + n; p++) {
        struct uffdio_copy one = {.dst = (uint64_t)(base + p * PAGE), .src = (uint64_t)zeros, .len = PAGE};
        if (ioctl(uffd, UFFDIO_COPY, &one) != 0 && errno != EEXIST)
            die("UFFDIO_COPY");
    }
}

static void *handler(void *arg) {
    (void)arg;
    for (;;) {
        struct pollfd p = {.fd = uffd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0)
            die("poll");
        struct uffd_msg m;
        if (read(uffd, &m, sizeof m) != sizeof m) {
            if (errno == EAGAIN)
                continue;
            die("read uffd");
        }
        if (m.event != UFFD_EVENT_PAGEFAULT)
            continue;
        size_t first = (m.arg.pagefault.address - (uint64_t)base) / PAGE;
        size_t n = first + window > pages ? pages - first : window;
        __atomic_add_fetch(&faults, 1, __ATOMIC_RELAXED);
        install(first, n);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: firsttouch anon|shmem|uffd MIB [WINDOW]\n");
        return 2;
    }
    const char *mode = argv[1];
    pages = strtoul(argv[2], 0, 10) << 20 >> 12;
    window = argc > 3 ? strtoul(argv[3], 0, 10) : 64;
    if (window == 0)
        window = 1;
    size_t len = pages * PAGE;
    if (!strcmp(mode, "anon")) {
        base = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    } else if (!strcmp(mode, "shmem") || !strcmp(mode, "uffd")) {
        int fd = memfd_create("firsttouch", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, len) != 0)
            die("memfd");
        base = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    } else {
        fprintf(stderr, "firsttouch: unknown mode %s\n", mode);
        return 2;
    }
    if (base == MAP_FAILED)
        die("mmap");
    if (!strcmp(mode, "uffd")) {
        zeros = aligned_alloc(PAGE, window * PAGE);
        memset(zeros, 0, window * PAGE);
        uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
        if (uffd < 0)
            die("userfaultfd");
        struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MISSING_SHMEM};
        if (ioctl(uffd, UFFDIO_API, &api) != 0)
            die("UFFDIO_API");
        struct uffdio_register r = {.range = {.start = (uint64_t)base, .len = len}, .mode = UFFDIO_REGISTER_MODE_MISSING};
        if (ioctl(uffd, UFFDIO_REGISTER, &r) != 0)
            die("UFFDIO_REGISTER");
        pthread_t t;
        pthread_create(&t, NULL, handler, NULL);
    }
    double t0 = now();
    for (size_t p = 0; p < pages; p++)
        base[p * PAGE] = 1;
    double s = now() - t0;
    uint64_t sum = 0;
    for (size_t i = 0; i < len; i++)
        sum += (unsigned char)base[i];
    printf("{\"mode\": \"%s\", \"pages\": %zu, \"window\": %zu, \"s\": %.6f, \"faults\": %ld, \"sum\": %llu}\n", mode, pages,
           window, s, faults, (unsigned long long)sum);
    return sum == pages ? 0 : 1;
}
