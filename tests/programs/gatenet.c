/* Gets around the socket stub as an attacker would, and connects to a TCP server on
 * 127.0.0.1:PORT:
 *   gatenet gate PORT   makes its socket calls through the shim's gate, the one instruction
 *                       (at a fixed address) whose socket system calls the shim's seccomp
 *                       filter lets through to the host's stack
 *   gatenet raw PORT    with syscall(2): a program not run under splitos
 * Prints how the connect went and, when it got through, what the server answered.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Below the shim's heap region (splitos_shim_abi::REGION_BASE - 0x10000). */
#define GATE 0x1fffffff0000UL

typedef long (*gate_fn)(long, long, long, long, long, long, long);
static int via_gate;

static long call(long nr, long a, long b, long c) {
    if (!via_gate)
        return syscall(nr, a, b, c, 0L, 0L, 0L);
    long r = ((gate_fn)GATE)(nr, a, b, c, 0, 0, 0);
    if (r < 0 && r > -4096) {
        errno = -r;
        return -1;
    }
    return r;
}

static int gate_mapped(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[256];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        found |= strncmp(line, "1fffffff0000-", 13) == 0 && strstr(line, "r-xp") != NULL;
    if (f)
        fclose(f);
    return found;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gatenet gate|raw PORT\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    via_gate = strcmp(argv[1], "gate") == 0;
    if (via_gate && !gate_mapped()) {
        printf("no gate in this process\n");
        return 2;
    }
    int s = call(SYS_socket, AF_INET, SOCK_STREAM, 0);
    if (s < 0) {
        printf("socket: %s\n", strerror(errno));
        return 1;
    }
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(argv[2]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (call(SYS_connect, s, (long)&a, sizeof a) != 0) {
        printf("connect: %s\n", strerror(errno));
        return 1;
    }
    printf("connected\n");
    const char *line = "an attacker's line\n";
    call(SYS_sendto, s, (long)line, strlen(line));
    char buf[160];
    long n = call(SYS_recvfrom, s, (long)buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = 0;
    printf("answer: %s", buf);
    return 0;
}
