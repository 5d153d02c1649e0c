/* A program linked with jemalloc that forks. jemalloc's constructor maps its arenas and
 * registers fork handlers that reset its locks in that memory in the child, before fork()
 * returns. The child checks both heaps (malloc's, and jemalloc's own through mallocx),
 * allocates from jemalloc and frees, and reports through a pipe. */
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned long sum(const unsigned char *a, size_t n) {
    unsigned long s = 0;
    for (size_t i = 0; i < n; i++) s = s * 131 + a[i];
    return s;
}

int main(int argc, char **argv) {
    size_t n = (argc > 1 ? strtoul(argv[1], 0, 10) : 8) << 20;
    unsigned char *a = malloc(n);
    unsigned char *b = mallocx(n, 0);
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i % 251), b[i] = (unsigned char)(i % 241);
    unsigned long sa = sum(a, n), sb = sum(b, n);
    int fds[2];
    if (pipe(fds)) return 2;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid == 0) {
        int same = sum(a, n) == sa && sum(b, n) == sb;
        unsigned char *c = mallocx(n, MALLOCX_ZERO);
        int zero = c[0] == 0 && c[n - 1] == 0;
        memcpy(c, b, n);
        int copied = sum(c, n) == sb;
        dallocx(c, 0);
        char msg[128];
        int len = snprintf(msg, sizeof msg, "child: heaps %s, jemalloc's new block %s and %s\n", same ? "as the parent left them" : "DIFFERENT", zero ? "zeroed" : "NOT ZEROED", copied ? "written" : "WRONG");
        if (write(fds[1], msg, len) != len) _exit(3);
        _exit(same && zero && copied ? 0 : 1);
    }
    close(fds[1]);
    memset(b, 0xa5, n);
    int st;
    if (waitpid(pid, &st, 0) != pid) return 2;
    char buf[128] = {0};
    if (read(fds[0], buf, sizeof buf - 1) < 0) return 2;
    fputs(buf, stdout);
    if (WIFSIGNALED(st)) printf("child killed by signal %d\n", WTERMSIG(st));
    else printf("child exited %d\n", WEXITSTATUS(st));
    printf("parent: malloc's heap %s\n", sum(a, n) == sa ? "intact" : "CORRUPTED");
    dallocx(b, 0);
    free(a);
    return 0;
}
