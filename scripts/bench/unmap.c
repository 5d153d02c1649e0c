/* What it costs a pager to take pages out of another process's page tables, the step that
 * evicting a line (its page punched out of the heap's memfd) and sampling a line's use (its
 * page unmapped, kept in the memfd, mapped again by the kernel when touched) both take
 * (scripts/bench/pagerfloor.py times it).
 *
 *   unmap HOW WHERE PAGES BATCH ROUNDS
 *
 * A child (the program) maps a shared memfd of PAGES pages and writes every page; the parent
 * (the pager) then takes every page out once, in an order scattered over the mapping, timed.
 * HOW:   pageout  process_madvise(MADV_PAGEOUT) with BATCH scattered pages per call: the page
 *                 stays in the memfd (sampling's unmap);
 *        pageout-run  process_madvise(MADV_PAGEOUT) of BATCH neighbouring pages in one range;
 *        punch    fallocate(PUNCH_HOLE) of one scattered page per call (eviction's);
 *        punch-run    fallocate(PUNCH_HOLE) of BATCH neighbouring pages in one call (a run of
 *                 victims leaving together).
 * WHERE: waits    the program blocked in a read, as while it waits for a miss;
 *        other    the program running on the other CPU.
 * Prints {"how", "where", "pages", "us_per_page", "calls", "still_mapped", "kept"} as JSON: the
 * time per page over ROUNDS, and after the last round the pages still in the program's page
 * tables (none, or nothing was taken out) and those that kept what the program wrote (all after
 * pageout, which leaves them in the memfd, or in swap if there is any; none after a punch). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#define PAGE 4096UL
#define MAX_BATCH 512

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s))
        die("sched_setaffinity");
}

/* The program: on each byte from `cmd`, writes every page (so all are mapped and dirty) and
 * answers on `ack`; running, it then spins over memory of its own until `stop` is set. */
static void program(char *mem, size_t pages, int cpu, int running, int cmd, int ack, volatile int *stop) {
    static char own[1 << 20];
    pin(cpu);
    for (;;) {
        char b;
        if (read(cmd, &b, 1) != 1)
            _exit(0);
        for (size_t i = 0; i < pages; i++)
            mem[i * PAGE]++;
        if (write(ack, "k", 1) != 1)
            _exit(1);
        if (!running)
            continue;
        unsigned long x = 0;
        while (!*stop)
            for (size_t i = 0; i < sizeof own; i += 64)
                x += ((volatile char *)own)[i];
        *stop = 0;
        if (write(ack, x ? "k" : "K", 1) != 1)
            _exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: unmap pageout|pageout-run|punch|punch-run waits|other PAGES BATCH ROUNDS\n");
        return 2;
    }
    const char *how = argv[1], *where = argv[2];
    size_t pages = strtoul(argv[3], 0, 10), batch = strtoul(argv[4], 0, 10);
    int rounds = atoi(argv[5]);
    if (batch < 1 || batch > MAX_BATCH || pages % batch || pages < 2)
        die("BATCH must divide PAGES and be at most 512");
    int punch = !strncmp(how, "punch", 5), run = strstr(how, "-run") != NULL;
    if (punch && !run)
        batch = 1;
    int running = !strcmp(where, "other");
    if (!running && strcmp(where, "waits"))
        die("WHERE must be waits or other");
    int fd = memfd_create("unmap", 0);
    if (fd < 0 || ftruncate(fd, pages * PAGE))
        die("memfd");
    char *mem = mmap(0, pages * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    volatile int *stop = mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED || stop == MAP_FAILED)
        die("mmap");
    int cmd[2], ack[2];
    if (pipe(cmd) || pipe(ack))
        die("pipe");
    pid_t child = fork();
    if (child == 0)
        program(mem, pages, 1, running, cmd[0], ack[1], stop);
    pin(0);
    int pidfd = syscall(SYS_pidfd_open, child, 0);
    if (pidfd < 0)
        die("pidfd_open");
    /* A scattered order: page i*stride mod pages, stride odd and coprime with a power of two. */
    size_t stride = 7919, groups = pages / batch;
    struct iovec iov[MAX_BATCH];
    double total = 0;
    long calls = 0;
    for (int r = 0; r < rounds; r++) {
        char b;
        if (write(cmd[1], "g", 1) != 1 || read(ack[0], &b, 1) != 1)
            die("program");
        usleep(2000);
        double t0 = now();
        for (size_t g = 0; g < groups; g++) {
            long ok;
            size_t first = (g * stride % groups) * batch;
            if (run && punch) {
                ok = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, first * PAGE, batch * PAGE);
            } else if (run) {
                iov[0].iov_base = mem + first * PAGE;
                iov[0].iov_len = batch * PAGE;
                ok = syscall(SYS_process_madvise, pidfd, iov, 1, MADV_PAGEOUT, 0);
            } else if (punch) {
                ok = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, first * PAGE, PAGE);
            } else {
                for (size_t j = 0; j < batch; j++) {
                    iov[j].iov_base = mem + ((g * batch + j) * stride % pages) * PAGE;
                    iov[j].iov_len = PAGE;
                }
                ok = syscall(SYS_process_madvise, pidfd, iov, batch, MADV_PAGEOUT, 0);
            }
            if (ok < 0)
                die(how);
            calls++;
        }
        total += now() - t0;
        if (running) {
            *stop = 1;
            if (read(ack[0], &b, 1) != 1)
                die("program");
        }
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/pagemap", child);
    int pm = open(path, O_RDONLY);
    if (pm < 0)
        die("pagemap");
    size_t still_mapped = 0, kept = 0;
    for (size_t i = 0; i < pages; i++) {
        unsigned long long e;
        if (pread(pm, &e, sizeof e, ((unsigned long)mem / PAGE + i) * sizeof e) != sizeof e)
            die("pagemap read");
        still_mapped += e >> 63;
    }
    /* Read through the pager's own mapping, which leaves the program's page tables alone. */
    for (size_t i = 0; i < pages; i++)
        kept += mem[i * PAGE] == (char)rounds;
    kill(child, SIGKILL);
    waitpid(child, 0, 0);
    printf("{\"how\": \"%s\", \"where\": \"%s\", \"pages\": %zu, \"us_per_page\": %.3f, \"calls\": %ld, \"still_mapped\": %zu, "
           "\"kept\": %zu}\n",
           how, where, pages, total / ((double)pages * rounds) * 1e6, calls, still_mapped, kept);
    return 0;
}
