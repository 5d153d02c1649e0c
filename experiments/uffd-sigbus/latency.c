// What one fault costs the faulting thread, by how it is delivered and served. A child process
// (the program) touches pages of a memfd region registered with userfaultfd, one at a time;
// its parent (the pComponent) holds the uffd and installs each page with UFFDIO_COPY from a page
// of its own memory, so that the numbers are the delivery floor without any miss-path work.
//
//   latency MODE [PAGES [ROUNDS]]
//   uffd-spin   ordinary uffd; the server busy-polls the uffd with non-blocking reads
//   uffd-sleep  ordinary uffd; the server sleeps in poll(2)
//   slot-spin   UFFD_FEATURE_SIGBUS; the program's SIGBUS handler posts the address in a slot of
//               shared memory and spins for the answer (futex after 50 µs); the server
//               busy-polls the slot and installs with UFFDIO_COPY_MODE_DONTWAKE
//   slot-sleep  as slot-spin, but the server sleeps on a futex and the handler wakes it
//   uffd-buddy  as uffd-spin, and the program has a SCHED_IDLE thread spinning on the faulting
//               thread's CPU, so that the CPU does not go idle (a virtual CPU halts) while the
//               faulting thread sleeps in the kernel: what the wake-up costs
//   self        UFFD_FEATURE_SIGBUS; the handler installs the page itself (no server: the
//               floor of the faulting thread serving its own fault, not a design, since the
//               pComponent holds the ExCache)
//
// LATENCY_PIN=1 puts the program on CPU 0 and the server on CPU 1 (uffd-buddy always does);
// LATENCY_PIN=same puts both on CPU 0, so that the fault is served on the faulting CPU by
// switching to the server thread there (no wake-up crosses CPUs).
// Prints p50/p90/p99/mean in microseconds as the faulting thread sees them.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define SPIN_NS 50000

enum { UFFD_SPIN, UFFD_SLEEP, UFFD_BUDDY, SLOT_SPIN, SLOT_SLEEP, SELF, MODES };
static const char *names[] = {"uffd-spin", "uffd-sleep", "uffd-buddy", "slot-spin", "slot-sleep", "self"};

// The request slot, in memory both processes map. Sequence numbers: the handler posts
// req = n with the address, the server answers done = n.
struct slot {
    uint32_t req, done;
    uint32_t server_sleeping, client_waiting;
    uint64_t addr;
    uint32_t stop;
};

static int mode, uffd;
static struct slot *slot;
static char src[PAGE] __attribute__((aligned(PAGE)));

static void die(const char *what) {
    perror(what);
    exit(2);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}

static long futex(uint32_t *w, int op, uint32_t val) { return syscall(SYS_futex, w, op, val, NULL, NULL, 0); }

static int copy(uint64_t page, int dontwake) {
    struct uffdio_copy c = {.dst = page, .src = (uintptr_t)src, .len = PAGE, .mode = dontwake ? UFFDIO_COPY_MODE_DONTWAKE : 0};
    if (ioctl(uffd, UFFDIO_COPY, &c) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    uint64_t page = (uintptr_t)si->si_addr & ~(PAGE - 1);
    if (mode == SELF) {
        copy(page, 1);
        return;
    }
    uint32_t n = slot->req + 1;
    slot->addr = page;
    __atomic_store_n(&slot->req, n, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&slot->server_sleeping, __ATOMIC_SEQ_CST))
        futex(&slot->req, FUTEX_WAKE, 1);
    uint64_t t0 = now_ns();
    while (__atomic_load_n(&slot->done, __ATOMIC_ACQUIRE) != n) {
        if (now_ns() - t0 < SPIN_NS) {
            __builtin_ia32_pause();
            continue;
        }
        __atomic_store_n(&slot->client_waiting, 1, __ATOMIC_SEQ_CST);
        uint32_t d = __atomic_load_n(&slot->done, __ATOMIC_SEQ_CST);
        if (d != n)
            futex(&slot->done, FUTEX_WAIT, d);
    }
}

static void serve_uffd(void) {
    for (;;) {
        struct uffd_msg m;
        ssize_t r = read(uffd, &m, sizeof m);
        if (r == sizeof m) {
            if (m.event == UFFD_EVENT_PAGEFAULT && copy(m.arg.pagefault.address & ~(PAGE - 1), 0) != 0)
                die("UFFDIO_COPY");
            continue;
        }
        if (__atomic_load_n(&slot->stop, __ATOMIC_ACQUIRE))
            return;
        if (mode == UFFD_SLEEP) {
            struct pollfd p = {.fd = uffd, .events = POLLIN};
            poll(&p, 1, 100);
        }
    }
}

static void serve_slot(void) {
    uint32_t seen = 0;
    for (;;) {
        uint32_t n = __atomic_load_n(&slot->req, __ATOMIC_ACQUIRE);
        if (n == seen) {
            if (__atomic_load_n(&slot->stop, __ATOMIC_ACQUIRE))
                return;
            if (mode == SLOT_SLEEP) {
                __atomic_store_n(&slot->server_sleeping, 1, __ATOMIC_SEQ_CST);
                if (__atomic_load_n(&slot->req, __ATOMIC_SEQ_CST) == seen) {
                    struct timespec t = {0, 100000000};
                    syscall(SYS_futex, &slot->req, FUTEX_WAIT, seen, &t, NULL, 0);
                }
                __atomic_store_n(&slot->server_sleeping, 0, __ATOMIC_SEQ_CST);
            } else {
                __builtin_ia32_pause();
            }
            continue;
        }
        seen = n;
        if (copy(slot->addr, 1) != 0)
            die("UFFDIO_COPY");
        __atomic_store_n(&slot->done, n, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&slot->client_waiting, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(&slot->client_waiting, 0, __ATOMIC_SEQ_CST);
            futex(&slot->done, FUTEX_WAKE, 1);
        }
    }
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static void *buddy(void *arg) {
    (void)arg;
    pin(0);
    struct sched_param p = {0};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);
    while (!__atomic_load_n(&slot->stop, __ATOMIC_RELAXED))
        __builtin_ia32_pause();
    return NULL;
}

static void send_fd(int sock, int fd) {
    char c = 0, cb[CMSG_SPACE(sizeof fd)];
    struct iovec iov = {.iov_base = &c, .iov_len = 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET, h->cmsg_type = SCM_RIGHTS, h->cmsg_len = CMSG_LEN(sizeof fd);
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    if (sendmsg(sock, &m, 0) != 1)
        die("sendmsg");
}

static int recv_fd(int sock) {
    char c, cb[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = &c, .iov_len = 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb};
    if (recvmsg(sock, &m, 0) != 1)
        die("recvmsg");
    int fd;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    return fd;
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void program(int sock, long pages, int rounds) {
    int memfd = memfd_create("latency", 0);
    if (memfd < 0 || ftruncate(memfd, pages * PAGE) != 0)
        die("memfd");
    char *region = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    int sigbus = mode >= SLOT_SPIN;
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MISSING_SHMEM | (sigbus ? UFFD_FEATURE_SIGBUS : 0)};
    struct uffdio_register reg = {.range = {.start = (uintptr_t)region, .len = pages * PAGE}, .mode = UFFDIO_REGISTER_MODE_MISSING};
    if (region == MAP_FAILED || uffd < 0 || ioctl(uffd, UFFDIO_API, &api) || ioctl(uffd, UFFDIO_REGISTER, &reg))
        die("uffd set-up");
    if (sigbus) {
        struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
        sigaction(SIGBUS, &sa, NULL);
    }
    if (mode == UFFD_BUDDY) {
        pthread_t t;
        pthread_create(&t, NULL, buddy, NULL);
    }
    send_fd(sock, uffd);
    uint64_t *lat = malloc(sizeof *lat * pages * rounds);
    long n = 0;
    for (int r = 0; r < rounds; r++) {
        for (long i = 0; i < pages; i++) {
            uint64_t t0 = now_ns();
            (void)*(volatile char *)(region + i * PAGE);
            lat[n++] = now_ns() - t0;
        }
        if (fallocate(memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, pages * PAGE) != 0)
            die("punch");
    }
    qsort(lat, n, sizeof *lat, cmp);
    double sum = 0;
    for (long i = 0; i < n; i++)
        sum += lat[i];
    printf("%-10s faults=%ld p50=%.1f p90=%.1f p99=%.1f mean=%.1f us\n", names[mode], n, lat[n / 2] / 1e3, lat[n * 9 / 10] / 1e3, lat[n * 99 / 100] / 1e3, sum / n / 1e3);
    __atomic_store_n(&slot->stop, 1, __ATOMIC_RELEASE);
    futex(&slot->req, FUTEX_WAKE, 1);
}

int main(int argc, char **argv) {
    mode = -1;
    for (int i = 0; argc > 1 && i < MODES; i++)
        if (!strcmp(argv[1], names[i]))
            mode = i;
    if (mode < 0)
        return fprintf(stderr, "usage: latency uffd-spin|uffd-sleep|uffd-buddy|slot-spin|slot-sleep|self [PAGES [ROUNDS]]\n"), 2;
    long pages = argc > 2 ? atol(argv[2]) : 4000;
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    memset(src, 'x', PAGE);
    slot = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int sp[2];
    if (slot == MAP_FAILED || socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0)
        die("set-up");
    const char *how = getenv("LATENCY_PIN") ? getenv("LATENCY_PIN") : "";
    int pinned = mode == UFFD_BUDDY || !strcmp(how, "1") || !strcmp(how, "same");
    int server_cpu = strcmp(how, "same") ? 1 : 0;
    pid_t child = fork();
    if (child == 0) {
        if (pinned)
            pin(0);
        program(sp[1], pages, rounds);
        fflush(stdout);
        _exit(0);
    }
    if (pinned)
        pin(server_cpu);
    uffd = recv_fd(sp[0]);
    if (mode <= UFFD_BUDDY)
        serve_uffd();
    else if (mode != SELF)
        serve_slot();
    int st;
    waitpid(child, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
