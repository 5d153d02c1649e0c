/* Forks with a library (atfork_early_lib.c) whose fork child handler, registered in its
 * constructor before any allocation, writes to the heap. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

const char *early_state(void);

int main(void) {
    const char *s = early_state();
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid == 0) {
        printf("child: %s\n", s);
        fflush(stdout);
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) return 2;
    if (WIFSIGNALED(st)) printf("child killed by signal %d\n", WTERMSIG(st));
    else printf("child exited %d\n", WEXITSTATUS(st));
    printf("parent: %s\n", s);
    return 0;
}
