// What the kernel does when a userfaultfd has UFFD_FEATURE_SIGBUS: which accesses to a
// non-resident (or write-protected) page of the region raise SIGBUS in the faulting thread
// and which fail inside a system call instead. The same accesses run against an ordinary
// userfaultfd served by another thread ("uffd") as the control.
//
//   probe sigbus|uffd          the access table
//   probe sigbus|uffd altstack a signal delivered on an alternate stack inside the region
//
// The region is a memfd mapped shared and registered for missing and write-protect faults,
// as the shim's heap is. "Evicting" a page saves its contents in `store` and punches it out
// of the memfd, as the pComponent does; a fault installs `store`'s copy with UFFDIO_COPY,
// write-protected after a read, as the miss path does.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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
#include <ucontext.h>
#include <unistd.h>

#define PAGE 4096UL
#define PAGES 64
#define X86_PF_PROT 1
#define X86_PF_WRITE 2

static char *region;
static int uffd, memfd, sigbus_mode;
static char store[PAGES][PAGE] __attribute__((aligned(PAGE)));
static volatile long traps, last_code, last_err;
static int next_page;

static void die(const char *what) {
    perror(what);
    exit(2);
}

static long idx(void *p) { return ((char *)p - region) / PAGE; }

static void install(void *page, int wp) {
    struct uffdio_copy c = {.dst = (uintptr_t)page, .src = (uintptr_t)store[idx(page)], .len = PAGE, .mode = wp ? UFFDIO_COPY_MODE_WP : 0};
    if (ioctl(uffd, UFFDIO_COPY, &c) != 0 && errno == EEXIST) {
        struct uffdio_range r = {.start = (uintptr_t)page, .len = PAGE};
        ioctl(uffd, UFFDIO_WAKE, &r);
    }
}

static void unprotect(void *page) {
    struct uffdio_writeprotect w = {.range = {.start = (uintptr_t)page, .len = PAGE}, .mode = 0};
    ioctl(uffd, UFFDIO_WRITEPROTECT, &w);
}

static void evict(void *page) {
    memcpy(store[idx(page)], page, PAGE);
    if (fallocate(memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, idx(page) * PAGE, PAGE) != 0)
        die("punch");
}

static char *fresh(void) {
    if (next_page >= PAGES)
        die("out of probe pages");
    return region + PAGE * next_page++;
}

// SIGBUS mode: the faulting thread serves itself. The x86 page-fault error code in the signal
// context tells a write (bit 1) and a present, protected page (bit 0) apart.
static void on_sigbus(int sig, siginfo_t *si, void *ucv) {
    ucontext_t *uc = ucv;
    char *a = si->si_addr;
    if (a < region || a >= region + PAGES * PAGE) {
        signal(sig, SIG_DFL);
        return;
    }
    traps++;
    last_code = si->si_code;
    last_err = uc->uc_mcontext.gregs[REG_ERR];
    void *page = (void *)((uintptr_t)a & ~(PAGE - 1));
    if (last_err & X86_PF_PROT)
        unprotect(page);
    else
        install(page, !(last_err & X86_PF_WRITE));
}

// uffd mode: another thread reads the fault messages and serves them.
static void *server(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) {
        struct pollfd p = {.fd = uffd, .events = POLLIN};
        poll(&p, 1, -1);
        struct uffd_msg m;
        if (read(uffd, &m, sizeof m) != sizeof m || m.event != UFFD_EVENT_PAGEFAULT)
            continue;
        traps++;
        last_err = m.arg.pagefault.flags;
        void *page = (void *)(uintptr_t)(m.arg.pagefault.address & ~(PAGE - 1));
        if (m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)
            unprotect(page);
        else
            install(page, !(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE));
    }
    return NULL;
}

static void setup(void) {
    for (int i = 0; i < PAGES; i++)
        memset(store[i], 'a' + i % 26, PAGE);
    memfd = memfd_create("probe", 0);
    if (memfd < 0 || ftruncate(memfd, PAGES * PAGE) != 0)
        die("memfd");
    region = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (region == MAP_FAILED)
        die("mmap");
    uffd = syscall(SYS_userfaultfd, O_CLOEXEC | (sigbus_mode ? 0 : O_NONBLOCK));
    if (uffd < 0)
        die("userfaultfd");
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_WP_HUGETLBFS_SHMEM | (sigbus_mode ? UFFD_FEATURE_SIGBUS : 0)};
    if (ioctl(uffd, UFFDIO_API, &api) != 0)
        die("UFFDIO_API");
    struct uffdio_register reg = {.range = {.start = (uintptr_t)region, .len = PAGES * PAGE}, .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0)
        die("UFFDIO_REGISTER");
    if (sigbus_mode) {
        struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_NODEFER};
        sigaction(SIGBUS, &sa, NULL);
    } else {
        pthread_t t;
        pthread_create(&t, NULL, server, NULL);
    }
}

// What the last trap said: SIGBUS's si_code and the x86 page-fault error code in the signal
// context, or the uffd message's flags.
static const char *how(void) {
    static char b[48];
    if (sigbus_mode)
        snprintf(b, sizeof b, "si_code=%ld err=%#lx", last_code, last_err);
    else
        snprintf(b, sizeof b, "msg flags=%#lx", last_err);
    return b;
}

static void row(const char *what, const char *result, long traps_before) {
    printf("%-58s %-34s traps=%ld\n", what, result, traps - traps_before);
}

// Two results may go into one row, so the strings alternate between two buffers.
static const char *rc(long r, int e) {
    static char bufs[2][64];
    static int turn;
    char *b = bufs[turn ^= 1];
    if (r < 0)
        snprintf(b, sizeof bufs[0], "-1 %s", strerror(e));
    else
        snprintf(b, sizeof bufs[0], "%ld", r);
    return b;
}

static int tmpfile_with(const char *text) {
    char path[] = "/tmp/uffd-probe-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        die("tmpfile");
    unlink(path);
    lseek(fd, 0, SEEK_SET);
    return fd;
}

static void table(void) {
    char buf[128];
    long t0;

    char *p = fresh();
    t0 = traps;
    char c = *(volatile char *)p;
    snprintf(buf, sizeof buf, "read '%c' %s", c, how());
    row("user read of a missing page", buf, t0);

    p = fresh();
    t0 = traps;
    *(volatile char *)p = 'W';
    snprintf(buf, sizeof buf, "ok %s", how());
    row("user write to a missing page", buf, t0);

    p = fresh();
    (void)*(volatile char *)p;
    t0 = traps;
    *(volatile char *)p = 'W';
    snprintf(buf, sizeof buf, "ok %s", how());
    row("user write to a page installed write-protected", buf, t0);

    int fd = tmpfile_with("0123456789");
    p = fresh();
    t0 = traps;
    long r = pread(fd, p, 10, 0);
    row("pread(2) from a file into a missing page", rc(r, errno), t0);

    p = fresh();
    (void)*(volatile char *)p;
    t0 = traps;
    r = pread(fd, p, 10, 0);
    row("pread(2) into a page installed write-protected", rc(r, errno), t0);

    p = fresh();
    fresh(); // the page after p, left missing
    *(volatile char *)p = 'W';
    t0 = traps;
    r = pread(fd, p + PAGE - 4, 10, 0);
    row("pread(2) of 10 bytes: 4 in a writable page, 6 in a missing", rc(r, errno), t0);

    p = fresh();
    t0 = traps;
    r = pwrite(fd, p, 10, 0);
    row("pwrite(2) to a file from a missing page", rc(r, errno), t0);

    p = fresh();
    strcpy(p, "/dev/null");
    evict(p);
    t0 = traps;
    r = open(p, O_RDONLY);
    row("open(2) of a path string in an evicted page", rc(r, errno), t0);
    if (r >= 0)
        close(r);

    p = fresh();
    uint32_t *w = (uint32_t *)p;
    *w = 7;
    evict(p);
    struct timespec ms = {0, 1000000};
    t0 = traps;
    r = syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, 7, &ms, NULL, 0);
    row("futex(FUTEX_WAIT) on a word in an evicted page", rc(r, errno), t0);

    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(s, (void *)&a, sizeof a) != 0 || getsockname(s, (void *)&a, &al) != 0)
        die("udp");
    sendto(s, "datagram", 8, 0, (void *)&a, sizeof a);
    p = fresh();
    t0 = traps;
    r = recv(s, p, 64, MSG_DONTWAIT);
    int e = errno;
    char good[64];
    long again = recv(s, good, sizeof good, MSG_DONTWAIT);
    snprintf(buf, sizeof buf, "%s; again: %s", rc(r, e), rc(again, errno));
    row("recv(2) of a UDP datagram into a missing page", buf, t0);

    int sp[2];
    socketpair(AF_UNIX, SOCK_DGRAM, 0, sp);
    send(sp[0], "datagram", 8, 0);
    p = fresh();
    t0 = traps;
    r = recv(sp[1], p, 64, MSG_DONTWAIT);
    e = errno;
    again = recv(sp[1], good, sizeof good, MSG_DONTWAIT);
    snprintf(buf, sizeof buf, "%s; again: %s", rc(r, e), rc(again, errno));
    row("recv(2) of a Unix datagram into a missing page", buf, t0);

    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    a.sin_port = 0;
    al = sizeof a;
    if (bind(l, (void *)&a, sizeof a) != 0 || listen(l, 4) != 0 || getsockname(l, (void *)&a, &al) != 0)
        die("tcp");
    int cl = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(cl, (void *)&a, sizeof a) != 0)
        die("connect");
    p = fresh();
    socklen_t *plen = (socklen_t *)(p + 512);
    *plen = sizeof(struct sockaddr_in);
    evict(p);
    t0 = traps;
    r = accept(l, (void *)p, plen);
    e = errno;
    again = accept(l, NULL, NULL);
    snprintf(buf, sizeof buf, "%s; again: %s", rc(r, e), rc(again, errno));
    row("accept(2) with the peer address going to an evicted page", buf, t0);
    struct pollfd pc = {.fd = cl, .events = POLLIN};
    poll(&pc, 1, 100);
    r = recv(cl, good, sizeof good, MSG_DONTWAIT);
    row("  the client's next recv(2)", rc(r, errno), traps);

    // stdio reads through the C library's internal read, which LD_PRELOAD cannot interpose;
    // the shim's malloc puts every FILE buffer in the region, as setvbuf does here.
    int lf = tmpfile_with("one\ntwo\nthree\n");
    FILE *f = fdopen(lf, "r");
    p = fresh();
    setvbuf(f, p, _IOFBF, PAGE);
    int lines = 0;
    errno = 0;
    t0 = traps;
    while (fgets(good, sizeof good, f))
        lines++;
    snprintf(buf, sizeof buf, "%d of 3 lines, ferror=%d%s", lines, ferror(f), ferror(f) ? " (EFAULT)" : "");
    row("fgets(3) loop, FILE buffer in a missing page", buf, t0);
}

static void on_usr1(int s) { (void)s; }

static void altstack(void) {
    char *stk = fresh();
    for (int i = 1; i < 4; i++)
        fresh();
    memset(stk, 0, 4 * PAGE);
    for (int i = 0; i < 4; i++)
        evict(stk + i * PAGE);
    stack_t ss = {.ss_sp = stk, .ss_size = 4 * PAGE};
    if (sigaltstack(&ss, NULL) != 0)
        die("sigaltstack");
    struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_ONSTACK};
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    printf("signal delivered on an alternate stack in evicted pages: handled\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "sigbus") && strcmp(argv[1], "uffd")))
        return fprintf(stderr, "usage: probe sigbus|uffd [altstack]\n"), 2;
    sigbus_mode = !strcmp(argv[1], "sigbus");
    setup();
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 2 && !strcmp(argv[2], "altstack"))
        altstack();
    else
        table();
    return 0;
}
