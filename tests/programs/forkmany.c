/* Forks N children at once (without exec), as a shell pipeline or a pre-forking server does;
 * each reads the parent's heap, writes a little of its own and exits. Prints how many forks
 * and children succeeded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 50;
    size_t size = (argc > 2 ? strtoul(argv[2], 0, 10) : 8) << 20;
    unsigned char *heap = malloc(size);
    for (size_t i = 0; i < size; i++) heap[i] = (unsigned char)(i % 253);
    unsigned long want = 0;
    for (size_t j = 0; j < size; j += 4096) want += heap[j];
    int forked = 0, ok = 0;
    int go[2];
    if (pipe(go)) return 2;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            continue;
        }
        if (pid == 0) {
            char c;
            close(go[1]);
            /* All children are alive at once before any reads its heap. */
            if (read(go[0], &c, 1) < 0) _exit(3);
            unsigned long s = 0;
            for (size_t j = 0; j < size; j += 4096) s += heap[j];
            char *mine = malloc(1 << 20);
            memset(mine, i, 1 << 20);
            _exit(s == want && mine[4095] == (char)i ? 0 : 1);
        }
        forked++;
    }
    close(go[1]);
    int status;
    while (wait(&status) > 0)
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ok++;
    printf("forked %d of %d, %d children ok\n", forked, n, ok);
    return forked == n && ok == n ? 0 : 1;
}
