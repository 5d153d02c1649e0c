/* TCP over raw system calls only (syscall(2), as Go programs and static binaries make
 * them), never libc's socket functions:
 *   rawnet serve PORT     listens on 127.0.0.1:PORT, serves one connection (echoes a line)
 *   rawnet connect PORT   connects to 127.0.0.1:PORT, sends a line, prints the answer
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

static long sys(long nr, long a, long b, long c, long d, long e, long f) {
    return syscall(nr, a, b, c, d, e, f);
}

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static int fail(const char *what) {
    printf("%s: %s\n", what, strerror(errno));
    return 1;
}

static int serve(int port) {
    int s = sys(SYS_socket, AF_INET, SOCK_STREAM, 0, 0, 0, 0);
    if (s < 0) return fail("socket");
    int one = 1;
    if (sys(SYS_setsockopt, s, SOL_SOCKET, SO_REUSEADDR, (long)&one, sizeof one, 0)) return fail("setsockopt");
    struct sockaddr_in a = loopback(port);
    if (sys(SYS_bind, s, (long)&a, sizeof a, 0, 0, 0)) return fail("bind");
    if (sys(SYS_listen, s, 8, 0, 0, 0, 0)) return fail("listen");
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    if (sys(SYS_getsockname, s, (long)&me, (long)&len, 0, 0, 0)) return fail("getsockname");
    printf("listening on %s:%d\n", inet_ntoa(me.sin_addr), ntohs(me.sin_port));
    fflush(stdout);
    struct sockaddr_in peer;
    len = sizeof peer;
    int c = sys(SYS_accept, s, (long)&peer, (long)&len, 0, 0, 0);
    if (c < 0) return fail("accept");
    printf("accepted from %s\n", inet_ntoa(peer.sin_addr));
    char buf[128];
    long n = sys(SYS_recvfrom, c, (long)buf, sizeof buf - 1, 0, 0, 0);
    if (n < 0) return fail("recvfrom");
    buf[n] = 0;
    printf("got: %s", buf);
    char out[160];
    int m = snprintf(out, sizeof out, "echo: %s", buf);
    if (sys(SYS_sendto, c, (long)out, m, 0, 0, 0) != m) return fail("sendto");
    close(c);
    close(s);
    return 0;
}

static int client(int port) {
    int s = sys(SYS_socket, AF_INET, SOCK_STREAM, 0, 0, 0, 0);
    if (s < 0) return fail("socket");
    struct sockaddr_in a = loopback(port);
    if (sys(SYS_connect, s, (long)&a, sizeof a, 0, 0, 0)) return fail("connect");
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    if (sys(SYS_getpeername, s, (long)&peer, (long)&len, 0, 0, 0)) return fail("getpeername");
    printf("connected to %s:%s\n", inet_ntoa(peer.sin_addr), ntohs(peer.sin_port) == port ? "PORT" : "another port");
    int err = -1;
    len = sizeof err;
    if (sys(SYS_getsockopt, s, SOL_SOCKET, SO_ERROR, (long)&err, (long)&len, 0)) return fail("getsockopt");
    printf("SO_ERROR %d\n", err);
    const char *line = "hello over raw system calls\n";
    if (sys(SYS_sendto, s, (long)line, strlen(line), 0, 0, 0) != (long)strlen(line)) return fail("sendto");
    char buf[160];
    long n, got = 0;
    while ((n = sys(SYS_recvfrom, s, (long)buf + got, sizeof buf - 1 - got, 0, 0, 0)) > 0) got += n;
    if (n < 0) return fail("recvfrom");
    buf[got] = 0;
    printf("answer: %s", buf);
    close(s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: rawnet serve|connect PORT\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int port = atoi(argv[2]);
    return strcmp(argv[1], "serve") == 0 ? serve(port) : client(port);
}
