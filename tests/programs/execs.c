/* Every way to start a new program image, each with an environment that lacks LD_PRELOAD and
 * SPLITOS_* (an empty envp, a cleaned envp, a cleared own environment, env -i), and each new
 * image must still run where its parent runs. The parent looks for the splitos heap region in
 * its own address space; a child image reports a mismatch (region missing under splitos, or
 * present natively) on stdout, so its output differs from a native run only when an image
 * lost the shim. The last line is the number of program images and forked copies the run
 * makes, which the test compares with the pComponent's `processes` counter.
 *
 *   execs               run every method
 *   execs child NAME R  a child image: R is 1 if it must have the region; prints NAME, its
 *                       extra arguments and a checksum of heap memory it fills */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int has_region(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "splitos-heap")) found = 1;
    if (f) fclose(f);
    return found;
}

static int child(int argc, char **argv) {
    int want = atoi(argv[3]);
    size_t n = 4 << 20;
    unsigned char *a = malloc(n);
    unsigned long s = 0;
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 7 + argc);
    for (size_t i = 0; i < n; i += 61) s = s * 31 + a[i];
    printf("child %s:", argv[2]);
    for (int i = 4; i < argc; i++) printf(" %s", argv[i]);
    printf(" sum=%lx%s\n", s, has_region() == want ? "" : want ? " NOT UNDER SPLITOS" : " UNEXPECTED REGION");
    return 0;
}

static char self[4096];
static char want[2];
static char *empty_env[] = {NULL};
static char *clean_env[] = {"FOO=bar", "PATH=/usr/bin:/bin", NULL};

#define ARGV(name, ...) (char *[]){"execs", "child", (char *)(name), want, __VA_ARGS__, NULL}

/* Each method runs in a forked child (one copy) and starts `images` program images. */
struct method {
    const char *name;
    int images;
    void (*run)(const char *name);
};

static void m_execve_empty(const char *n) { execve(self, ARGV(n, "x"), empty_env); }
static void m_execve_clean(const char *n) { execve(self, ARGV(n, "x"), clean_env); }
static void m_execve_null(const char *n) { execve(self, ARGV(n, "x"), NULL); }
/* LD_PRELOAD kept, SPLITOS_* dropped */
static void m_execve_preload(const char *n) {
    char preload[8192];
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s", getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
    execve(self, ARGV(n, "x"), (char *[]){preload, NULL});
}
static void m_execle(const char *n) { execle(self, "execs", "child", n, want, (char *)NULL, empty_env); }
static void m_execle_many(const char *n) {
    execle(self, "execs", "child", n, want, "a1", "a2", "a3", "a4", "a5", "a6", (char *)NULL, clean_env);
}
static void m_execv(const char *n) { clearenv(); execv(self, ARGV(n, "x")); }
static void m_execvp(const char *n) { clearenv(); execvp(self, ARGV(n, "x")); }
static void m_execl(const char *n) { clearenv(); execl(self, "execs", "child", n, want, (char *)NULL); }
static void m_execl_many(const char *n) {
    clearenv();
    execl(self, "execs", "child", n, want, "a1", "a2", "a3", "a4", "a5", "a6", "a7", (char *)NULL);
}
static void m_execlp(const char *n) { environ = empty_env; execlp(self, "execs", "child", n, want, "b1", (char *)NULL); }
static void m_execvpe(const char *n) { execvpe(self, ARGV(n, "x"), empty_env); }
static void m_fexecve(const char *n) {
    int fd = open(self, O_RDONLY | O_CLOEXEC);
    fexecve(fd, ARGV(n, "x"), empty_env);
}
static void m_execveat(const char *n) { execveat(AT_FDCWD, self, ARGV(n, "x"), empty_env, 0); }
static void spawn_and_wait(int p, const char *n) {
    pid_t pid;
    int r = p ? posix_spawnp(&pid, self, NULL, NULL, ARGV(n, "x"), empty_env)
              : posix_spawn(&pid, self, NULL, NULL, ARGV(n, "x"), clean_env);
    if (r) { printf("%s failed: %s\n", n, strerror(r)); fflush(stdout); _exit(1); }
    int st;
    waitpid(pid, &st, 0);
    _exit(WEXITSTATUS(st));
}
static void m_posix_spawn(const char *n) { spawn_and_wait(0, n); }
static void m_posix_spawnp(const char *n) { spawn_and_wait(1, n); }
static void m_env_i(const char *n) { execv("/usr/bin/env", (char *[]){"env", "-i", self, "child", (char *)n, want, "x", NULL}); }
static void m_system(const char *n) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "exec '%s' child %s %s x", self, n, want);
    clearenv();
    int st = system(cmd);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
}
static void m_popen(const char *n) {
    char cmd[8192], line[512];
    snprintf(cmd, sizeof cmd, "exec '%s' child %s %s x", self, n, want);
    unsetenv("LD_PRELOAD");
    FILE *f = popen(cmd, "r");
    while (f && fgets(line, sizeof line, f)) fputs(line, stdout);
    fflush(stdout);
    _exit(f && pclose(f) == 0 ? 0 : 1);
}
/* More than 8 KiB of environment: the shim builds the new one in a mapping of its own. */
static void m_big_env(const char *n) {
    static char *big[3001];
    for (int i = 0; i < 3000; i++) {
        big[i] = malloc(32);
        snprintf(big[i], 32, "BIG%d=%d", i, i);
    }
    execve(self, ARGV(n, "x"), big);
}

static const struct method methods[] = {
    {"execve-empty", 1, m_execve_empty}, {"execve-clean", 1, m_execve_clean}, {"execve-null", 1, m_execve_null},
    {"execve-preload", 1, m_execve_preload},
    {"execle", 1, m_execle},             {"execle-many", 1, m_execle_many},   {"execv", 1, m_execv},
    {"execvp", 1, m_execvp},             {"execl", 1, m_execl},               {"execl-many", 1, m_execl_many},
    {"execlp", 1, m_execlp},             {"execvpe", 1, m_execvpe},           {"fexecve", 1, m_fexecve},
    {"execveat", 1, m_execveat},         {"posix_spawn", 1, m_posix_spawn},   {"posix_spawnp", 1, m_posix_spawnp},
    {"env-i", 2, m_env_i},               {"system", 2, m_system},             {"popen", 2, m_popen},
    {"big-env", 1, m_big_env},
};

int main(int argc, char **argv) {
    if (argc > 3 && !strcmp(argv[1], "child")) return child(argc, argv);
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len < 0) return 2;
    self[len] = 0;
    want[0] = has_region() ? '1' : '0';
    int copies = 1;
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            methods[i].run(methods[i].name);
            printf("%s: did not start the image: %m\n", methods[i].name);
            fflush(stdout);
            _exit(1);
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) printf("%s: child status %d\n", methods[i].name, st);
        copies += 1 + methods[i].images;
    }
    /* vfork: the child shares the parent's memory until it execs; the shim must build the
     * environment without allocating. */
    fflush(stdout);
    pid_t pid = vfork();
    if (pid == 0) {
        execve(self, ARGV("vfork-execve", "x"), empty_env);
        _exit(1);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) printf("vfork-execve: child status %d\n", st);
    copies += 1;
    printf("images and copies: %d\n", copies);
    return 0;
}
