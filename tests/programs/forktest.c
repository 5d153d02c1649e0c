/* fork without exec: the child sees a private copy of the whole heap (resident and
 * non-resident lines), and neither side sees the other's later writes. */
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
    size_t n = (argc > 1 ? strtoul(argv[1], 0, 10) : 32) << 20;
    unsigned char *a = malloc(n);
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i % 251);
    unsigned long before = sum(a, n);
    int fds[2];
    if (pipe(fds)) return 2;
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid == 0) {
        unsigned long c = sum(a, n);
        memset(a, 0x5a, n / 2);
        unsigned long after = sum(a, n);
        char *msg = malloc(128);
        int len = snprintf(msg, 128, "child sum=%s changed=%s\n", c == before ? "same" : "DIFFERENT", after != c ? "yes" : "no");
        write(fds[1], msg, len);
        _exit(0);
    }
    memset(a + n / 2, 0xa5, n / 2);
    int st;
    waitpid(pid, &st, 0);
    char buf[128] = {0};
    read(fds[0], buf, sizeof buf - 1);
    int untouched = 1;
    for (size_t i = 0; i < n / 2; i++) if (a[i] != (unsigned char)(i % 251)) { untouched = 0; break; }
    printf("%sparent first half %s, child exit %d\n", buf, untouched ? "intact" : "CORRUPTED", WEXITSTATUS(st));
    return 0;
}
