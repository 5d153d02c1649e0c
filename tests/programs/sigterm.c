/* Signal forwarding: the program says "ready" once its heap is in use, then waits. With
 * "handle", SIGTERM and SIGHUP reach a handler that prints (write(2): async-signal-safe) what
 * it got and a checksum of heap memory, and exits with 40 + the signal number; with "default"
 * the signal kills it. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned char *heap;
static size_t n = 8 << 20;

static void on_signal(int sig) {
    unsigned long s = 0;
    for (size_t i = 0; i < n; i += 4096) s = s * 31 + heap[i];
    char msg[96];
    int len = snprintf(msg, sizeof msg, "got %s, heap sum %lx\n", sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "other", s);
    write(1, msg, len);
    _exit(40 + sig);
}

int main(int argc, char **argv) {
    heap = malloc(n);
    for (size_t i = 0; i < n; i++) heap[i] = (unsigned char)(i / 4096 * 7);
    if (argc > 1 && !strcmp(argv[1], "handle")) {
        struct sigaction sa = {.sa_handler = on_signal};
        sigaction(SIGTERM, &sa, 0);
        sigaction(SIGHUP, &sa, 0);
    }
    printf("ready\n");
    fflush(stdout);
    for (;;) pause();
}
