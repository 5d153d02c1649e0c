/* A child made by the clone system call without CLONE_VM, bypassing fork(): no LD_PRELOAD
 * library sees it. Natively it has a copy of its parent's heap; under splitos it has none (the
 * heap region is not inherited), and must never read wrong memory or act on its parent's.
 *   rawclone heap   the child reads a string its parent put on the heap
 *   rawclone mmap   the child maps anonymous memory (a request to the pComponent)
 *   rawclone outlive MIB   the parent fills MIB MiB, says "parent ends" and ends while the
 *                   child lives on (holding what the parent had open) until its stdin closes */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "heap";
    char *s = malloc(64);
    strcpy(s, "the parent's heap string");
    if (!strcmp(mode, "outlive")) {
        size_t n = (argc > 2 ? strtoul(argv[2], 0, 10) : 16) << 20;
        char *m = malloc(n);
        if (!m) { perror("malloc"); return 2; }
        memset(m, 1, n);
    }
    fflush(stdout);
    long pid = syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, 0);
    if (pid < 0) { perror("clone"); return 2; }
    if (pid == 0) {
        char line[128];
        int len;
        if (!strcmp(mode, "outlive")) {
            while (read(0, line, sizeof line) > 0) {}
            _exit(0);
        }
        if (!strcmp(mode, "heap")) {
            len = snprintf(line, sizeof line, "child read: %.*s\n", (int)strlen(s), s);
        } else {
            char *m = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m != MAP_FAILED) m[12345] = 1;
            len = snprintf(line, sizeof line, "child mmap: %s\n", m == MAP_FAILED ? "failed" : "works");
        }
        write(1, line, len);
        _exit(0);
    }
    if (!strcmp(mode, "outlive")) {
        printf("parent ends\n");
        return 0;
    }
    int st;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st)) printf("child killed by signal %d\n", WTERMSIG(st));
    else printf("child exited %d\n", WEXITSTATUS(st));
    printf("parent still reads: %s\n", s);
    return 0;
}
