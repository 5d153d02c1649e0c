/* The floor of paging from user space on this machine: the cheapest pager userfaultfd allows,
 * with "remote" memory that is a local buffer (no network, no bookkeeping, no checksum), run
 * beside the same program under Linux. A program thread makes ACCESSES read-modify-writes of
 * a random word of a random page of PAGES pages, with WORK rounds of arithmetic after each;
 * at most RESIDENT pages stay in its memory.
 *
 *   pager native PAGES RESIDENT ACCESSES WORK   anonymous memory (run it in a memory cgroup)
 *   pager inline PAGES RESIDENT ACCESSES WORK   one handler thread: on each miss it evicts the
 *                                               oldest page (copy, hole punch) and installs
 *                                               the missed one (UFFDIO_COPY)
 *   pager bg PAGES RESIDENT ACCESSES WORK       the same, with a second thread taking victims
 *                                               out ahead of the misses (splice, punch, read),
 *                                               as a kernel's kswapd or splitos's evictor does
 *   pager samecpu PAGES RESIDENT ACCESSES WORK  inline, with the handler on the program's CPU,
 *                                               sleeping until a fault: no wake-up crosses CPUs
 *   pager samecpu-bg ...                        samecpu, with bg's evictor on the other CPU
 *   pager sigbus PAGES RESIDENT ACCESSES WORK   no handler thread: the faulting thread serves
 *                                               its own miss in a SIGBUS handler (the kernel's
 *                                               way; a pager for any program cannot take it, as
 *                                               a system call reading into a missing page then
 *                                               fails with EFAULT instead of waiting)
 *
 * Prints one line of JSON: the access phase's seconds, misses (natively, its major faults: the
 * swap-ins under a memory cgroup) and evictions, and a checksum of the memory that must equal
 * the native run's. Needs root only for the memory cgroup. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define PAGE 4096ul

static size_t pages, resident, accesses, work;
static unsigned char *base, *far;
static int uffd, memfd;
static atomic_int stop;
static atomic_ulong misses, evictions;

/* Resident pages in the order they came: a ring the handler pushes to and victims leave. */
static size_t *ring, head, tail, count;
static pthread_mutex_t ring_mu = PTHREAD_MUTEX_INITIALIZER;

/* Takes the oldest resident page out: its bytes to the far buffer, its page freed. The one
 * program thread is waiting in a fault, so it cannot write the page meanwhile. */
static void evict_copy(size_t v) {
    memcpy(far + v * PAGE, base + v * PAGE, PAGE);
    if (fallocate(memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, v * PAGE, PAGE)) die("punch");
    atomic_fetch_add(&evictions, 1);
}

/* As evict_copy, safe while the program runs (the background evictor's way): the page is held
 * in a pipe while it is punched out, so a write until the punch is in what is read back. */
static int pipefd[2];
/* Pages between their punch and the end of their copy: a miss on one waits for the copy. */
static atomic_uchar *leaving;
static void evict_splice(size_t v) {
    loff_t off = v * PAGE;
    atomic_store(&leaving[v], 1);
    if (splice(memfd, &off, pipefd[1], NULL, PAGE, 0) != (ssize_t)PAGE) die("splice");
    if (fallocate(memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, v * PAGE, PAGE)) die("punch");
    for (size_t got = 0; got < PAGE;) {
        ssize_t n = read(pipefd[0], far + v * PAGE + got, PAGE - got);
        if (n <= 0) die("read pipe");
        got += n;
    }
    atomic_store(&leaving[v], 0);
    atomic_fetch_add(&evictions, 1);
}

static int pop_oldest(size_t *v) {
    pthread_mutex_lock(&ring_mu);
    int ok = count > 0;
    if (ok) {
        *v = ring[head];
        head = (head + 1) % resident;
        count--;
    }
    pthread_mutex_unlock(&ring_mu);
    return ok;
}

static void push(size_t p) {
    pthread_mutex_lock(&ring_mu);
    ring[tail] = p;
    tail = (tail + 1) % resident;
    count++;
    pthread_mutex_unlock(&ring_mu);
}

static int background, same_cpu;
/* With same_cpu: the program's and its handler's CPU, and another for bg's evictor (-1: none),
 * the first two this process may use. */
static int program_cpu = -1, other_cpu = -1;

static void *handler(void *arg) {
    (void)arg;
    struct uffd_msg msg;
    while (!atomic_load(&stop)) {
        if (same_cpu) {
            struct pollfd pf = {.fd = uffd, .events = POLLIN};
            if (poll(&pf, 1, 10) < 0 && errno != EINTR) die("poll");
        }
        ssize_t n = read(uffd, &msg, sizeof msg);
        if (n != sizeof msg) {
            if (n < 0 && errno != EAGAIN) die("read uffd");
            continue;
        }
        if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
        size_t p = (msg.arg.pagefault.address - (uintptr_t)base) / PAGE;
        size_t v;
        pthread_mutex_lock(&ring_mu);
        int full = count >= resident;
        pthread_mutex_unlock(&ring_mu);
        if (full && pop_oldest(&v)) evict_copy(v);
        while (atomic_load(&leaving[p])) {
        }
        struct uffdio_copy c = {.dst = (uintptr_t)base + p * PAGE, .src = (uintptr_t)far + p * PAGE, .len = PAGE};
        if (ioctl(uffd, UFFDIO_COPY, &c) && errno != EEXIST) die("UFFDIO_COPY");
        atomic_fetch_add(&misses, 1);
        push(p);
    }
    return NULL;
}

/* The faulting thread's own miss: a victim out, the page in, no wake-up (nobody sleeps). */
static void on_sigbus(int sig, siginfo_t *si, void *ctx) {
    (void)sig, (void)ctx;
    size_t p = ((uintptr_t)si->si_addr - (uintptr_t)base) / PAGE, v;
    if (count >= resident) {
        v = ring[head];
        head = (head + 1) % resident;
        count--;
        evict_copy(v);
    }
    struct uffdio_copy c = {.dst = (uintptr_t)base + p * PAGE, .src = (uintptr_t)far + p * PAGE, .len = PAGE, .mode = UFFDIO_COPY_MODE_DONTWAKE};
    if (ioctl(uffd, UFFDIO_COPY, &c) && errno != EEXIST) die("UFFDIO_COPY");
    atomic_fetch_add(&misses, 1);
    ring[tail] = p;
    tail = (tail + 1) % resident;
    count++;
}

/* Keeps a sixteenth of the resident pages free, taking victims out 32 at a time. */
static void *evictor(void *arg) {
    (void)arg;
    if (same_cpu && other_cpu >= 0) {
        cpu_set_t other;
        CPU_ZERO(&other);
        CPU_SET(other_cpu, &other);
        if (sched_setaffinity(0, sizeof other, &other)) die("sched_setaffinity");
    }
    size_t low = resident - resident / 16, batch = 32;
    while (!atomic_load(&stop)) {
        pthread_mutex_lock(&ring_mu);
        size_t c = count;
        pthread_mutex_unlock(&ring_mu);
        if (c < low) {
            usleep(50);
            continue;
        }
        size_t v;
        for (size_t i = 0; i < batch && pop_oldest(&v); i++) evict_splice(v);
    }
    return NULL;
}

static void setup_uffd(int sigbus) {
    memfd = memfd_create("pager", MFD_CLOEXEC);
    if (memfd < 0 || ftruncate(memfd, pages * PAGE)) die("memfd");
    base = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    far = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (base == MAP_FAILED || far == MAP_FAILED) die("mmap");
    uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (uffd < 0) die("userfaultfd");
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MISSING_SHMEM | (sigbus ? UFFD_FEATURE_SIGBUS : 0)};
    if (ioctl(uffd, UFFDIO_API, &api)) die("UFFDIO_API");
    struct uffdio_register r = {.range = {.start = (uintptr_t)base, .len = pages * PAGE}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (ioctl(uffd, UFFDIO_REGISTER, &r)) die("UFFDIO_REGISTER");
    ring = calloc(resident, sizeof *ring);
    leaving = calloc(pages, sizeof *leaving);
    if (pipe2(pipefd, O_CLOEXEC)) die("pipe");
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: pager native|inline|bg|samecpu|samecpu-bg|sigbus PAGES RESIDENT ACCESSES WORK\n");
        return 2;
    }
    const char *mode = argv[1];
    pages = strtoul(argv[2], 0, 10);
    resident = strtoul(argv[3], 0, 10);
    accesses = strtoul(argv[4], 0, 10);
    work = strtoul(argv[5], 0, 10);
    pthread_t h, e;
    int paged = strcmp(mode, "native") != 0;
    background = strstr(mode, "bg") != NULL;
    same_cpu = strncmp(mode, "samecpu", 7) == 0;
    int sigbus = strcmp(mode, "sigbus") == 0;
    if (same_cpu) {
        cpu_set_t allowed, one;
        if (sched_getaffinity(0, sizeof allowed, &allowed)) die("sched_getaffinity");
        for (int c = 0; c < CPU_SETSIZE; c++) {
            if (!CPU_ISSET(c, &allowed)) continue;
            if (program_cpu < 0)
                program_cpu = c;
            else if (other_cpu < 0)
                other_cpu = c;
        }
        CPU_ZERO(&one);
        CPU_SET(program_cpu, &one);
        if (sched_setaffinity(0, sizeof one, &one)) die("sched_setaffinity");
    }
    if (sigbus) {
        setup_uffd(1);
        struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
        if (sigaction(SIGBUS, &sa, NULL)) die("sigaction");
    } else if (paged) {
        setup_uffd(0);
        if (pthread_create(&h, NULL, handler, NULL)) die("pthread_create");
        if (background && pthread_create(&e, NULL, evictor, NULL)) die("pthread_create");
    } else {
        base = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) die("mmap");
    }
    for (size_t p = 0; p < pages; p++) memset(base + p * PAGE, (int)(p & 0xff), PAGE);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long majflt0 = ru.ru_majflt;
    unsigned long m0 = atomic_load(&misses);
    uint64_t rng = 88172645463325252ull, x = 1;
    double t0 = now();
    for (size_t i = 0; i < accesses; i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        volatile uint64_t *q = (volatile uint64_t *)(base + (rng % pages) * PAGE) + (rng >> 40) % (PAGE / 8);
        *q += 1;
        for (size_t w = 0; w < work; w++) x = x * 6364136223846793005ull + 1442695040888963407ull;
    }
    double secs = now() - t0;
    unsigned long m = atomic_load(&misses) - m0;
    getrusage(RUSAGE_SELF, &ru);
    /* Natively, the pages read back from swap in the timed phase (major faults): not the fill
     * before it or the checksum after it. */
    if (!paged) m = (unsigned long)(ru.ru_majflt - majflt0);
    uint64_t sum = x & 1;
    for (size_t p = 0; p < pages; p++)
        for (size_t o = 0; o < PAGE; o += 512) sum = sum * 31 + ((volatile uint64_t *)(base + p * PAGE + o))[0];
    atomic_store(&stop, 1);
    if (paged && !sigbus) {
        pthread_join(h, NULL);
        if (background) pthread_join(e, NULL);
    }
    printf("{\"mode\": \"%s\", \"pages\": %zu, \"resident\": %zu, \"accesses\": %zu, \"work\": %zu, \"s\": %.6f, "
           "\"misses\": %lu, \"evictions\": %lu, \"sum\": \"%016llx\"}\n",
           mode, pages, resident, accesses, work, secs, m, atomic_load(&evictions), (unsigned long long)sum);
    return 0;
}
