/* The BSD socket calls a program makes, with output that does not depend on where its
 * stack is: run natively and under splitos (sockets on an nComponent), the lines must match.
 * Usage: sockets IP CLOSED_PORT (IP: an address of the stack's host, CLOSED_PORT: a port
 * nobody listens on there). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static struct sockaddr_in at(const char *ip, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
}

static void check(int ok, const char *what) {
    if (!ok) {
        printf("FAILED %s: %s\n", what, strerror(errno));
        exit(1);
    }
}

static int listener(const char *ip, int *port, int flags) {
    int s = socket(AF_INET, SOCK_STREAM | flags, 0);
    check(s >= 0, "socket");
    int one = 1;
    check(setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0, "SO_REUSEADDR");
    struct sockaddr_in a = at(ip, 0);
    check(bind(s, (struct sockaddr *)&a, sizeof a) == 0, "bind");
    socklen_t len = sizeof a;
    check(getsockname(s, (struct sockaddr *)&a, &len) == 0 && len == sizeof a, "getsockname");
    *port = ntohs(a.sin_port);
    check(listen(s, 16) == 0, "listen");
    return s;
}

static int dial(const char *ip, int port) {
    int c = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    struct sockaddr_in a = at(ip, port);
    check(c >= 0 && connect(c, (struct sockaddr *)&a, sizeof a) == 0, "connect");
    return c;
}

static size_t read_all(int fd, char *buf, size_t max) {
    size_t got = 0;
    for (;;) {
        ssize_t n = read(fd, buf + got, max - got);
        if (n <= 0) return got;
        got += n;
    }
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    const char *ip = argv[1];
    int closed = atoi(argv[2]), port;
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN);

    /* A listening socket inherited by a forked child, which serves one connection. */
    int l = listener(ip, &port, SOCK_CLOEXEC);
    int opt = 0;
    socklen_t olen = sizeof opt;
    check(getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &opt, &olen) == 0, "SO_ACCEPTCONN");
    printf("listening: accepting=%d\n", opt);
    pid_t child = fork();
    if (child == 0) {
        struct sockaddr_in peer;
        socklen_t plen = sizeof peer;
        int c = accept4(l, (struct sockaddr *)&peer, &plen, SOCK_CLOEXEC);
        check(c >= 0, "accept4");
        char buf[256], addr[64];
        size_t n = read_all(c, buf, sizeof buf - 1);
        buf[n] = 0;
        inet_ntop(AF_INET, &peer.sin_addr, addr, sizeof addr);
        printf("child got %zu bytes: %s (peer is %s: %s)\n", n, buf, strcmp(addr, ip) == 0 ? "the listening address" : "elsewhere", plen == sizeof peer ? "full length" : "short");
        check(write(c, "bye", 3) == 3, "write");
        close(c);
        _exit(0);
    }
    int c = dial(ip, port);
    struct sockaddr_in me, peer;
    socklen_t len = sizeof me;
    check(getsockname(c, (struct sockaddr *)&me, &len) == 0 && getpeername(c, (struct sockaddr *)&peer, &len) == 0, "names");
    printf("connected: peer port %s\n", ntohs(peer.sin_port) == port ? "is the listener's" : "differs");
    int d = dup(c);
    close(c);
    check(send(d, "hello over a dup", 16, MSG_NOSIGNAL) == 16, "send");
    check(shutdown(d, SHUT_WR) == 0, "shutdown");
    char buf[256];
    size_t n = read_all(d, buf, sizeof buf - 1);
    buf[n] = 0;
    printf("reply after shutdown: %s\n", buf);
    close(d);
    int status;
    waitpid(child, &status, 0);
    close(l);

    /* Options travel to the socket's stack and back. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1, v = 0;
    olen = sizeof v;
    check(setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0, "TCP_NODELAY");
    check(getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &olen) == 0, "get TCP_NODELAY");
    int ty = 0, dom = 0;
    socklen_t tl = sizeof ty, dl = sizeof dom;
    check(getsockopt(s, SOL_SOCKET, SO_TYPE, &ty, &tl) == 0 && getsockopt(s, SOL_SOCKET, SO_DOMAIN, &dom, &dl) == 0, "SO_TYPE");
    printf("options: nodelay=%d stream=%d inet=%d\n", v != 0, ty == SOCK_STREAM, dom == AF_INET);
    close(s);

    /* Refused, blocking and not. */
    struct sockaddr_in nobody = at(ip, closed);
    s = socket(AF_INET, SOCK_STREAM, 0);
    int r = connect(s, (struct sockaddr *)&nobody, sizeof nobody);
    printf("blocking connect to a closed port: %d %s\n", r, strerror(errno));
    close(s);
    s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    r = connect(s, (struct sockaddr *)&nobody, sizeof nobody);
    int inprogress = r < 0 && errno == EINPROGRESS;
    struct pollfd pf = {.fd = s, .events = POLLOUT};
    poll(&pf, 1, 5000);
    int err = 0;
    olen = sizeof err;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &olen);
    printf("non-blocking connect to a closed port: in progress=%d, then %s\n", inprogress || r == 0, strerror(err));
    close(s);

    /* epoll on a non-blocking listener; a non-blocking connect that succeeds. */
    l = listener(ip, &port, SOCK_NONBLOCK);
    struct sockaddr_in pa;
    socklen_t pl = sizeof pa;
    r = accept(l, (struct sockaddr *)&pa, &pl);
    printf("accept with nothing pending: %d %s\n", r, strerror(errno));
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l}, out;
    check(epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) == 0, "epoll_ctl");
    s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in to = at(ip, port);
    r = connect(s, (struct sockaddr *)&to, sizeof to);
    inprogress = r == 0 || errno == EINPROGRESS;
    pf = (struct pollfd){.fd = s, .events = POLLOUT};
    int ready = poll(&pf, 1, 5000);
    err = -1;
    olen = sizeof err;
    getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &olen);
    printf("non-blocking connect: in progress=%d, writable=%d, error=%d\n", inprogress, ready == 1 && (pf.revents & POLLOUT), err);
    int nev = epoll_wait(ep, &out, 1, 5000);
    int a = accept4(l, NULL, NULL, SOCK_NONBLOCK);
    printf("epoll saw the connection: %d, accepted=%d, non-blocking=%d\n", nev == 1 && out.data.fd == l, a >= 0, a >= 0 && (fcntl(a, F_GETFL) & O_NONBLOCK) != 0);

    /* A receive timeout, select, then 8 MiB each way with a checksum. */
    int fl = fcntl(s, F_GETFL);
    fcntl(s, F_SETFL, fl & ~O_NONBLOCK);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
    check(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0, "SO_RCVTIMEO");
    r = recv(s, buf, sizeof buf, 0);
    printf("receive with nothing sent: %d %s\n", r, errno == EAGAIN ? "timed out" : strerror(errno));
    check(write(a, "x", 1) == 1, "write x");
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(s, &rs);
    struct timeval five = {.tv_sec = 5};
    printf("select sees a byte: %d\n", select(s + 1, &rs, NULL, NULL, &five) == 1 && FD_ISSET(s, &rs));
    recv(s, buf, 1, 0);
    fcntl(a, F_SETFL, fcntl(a, F_GETFL) & ~O_NONBLOCK);
    tv.tv_sec = 10;
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    enum { TOTAL = 8 << 20 };
    pid_t writer = fork();
    if (writer == 0) {
        char chunk[65536];
        for (size_t off = 0; off < TOTAL; off += sizeof chunk) {
            for (size_t i = 0; i < sizeof chunk; i++) chunk[i] = (char)((off + i) * 131 % 251);
            check(write(s, chunk, sizeof chunk) == (ssize_t)sizeof chunk, "bulk write");
        }
        _exit(0);
    }
    unsigned long sum = 0, got = 0;
    char chunk[65536];
    while (got < TOTAL) {
        ssize_t k = read(a, chunk, sizeof chunk);
        if (k <= 0) break;
        for (ssize_t i = 0; i < k; i++) sum = sum * 31 + (unsigned char)chunk[i];
        got += k;
    }
    waitpid(writer, &status, 0);
    printf("bulk: %lu bytes, checksum %lx\n", got, sum);

    /* The peer goes away: the stream ends, and writing fails with EPIPE. */
    close(a);
    r = read(s, buf, sizeof buf);
    printf("read after the peer closed: %d\n", r);
    int epipe = 0;
    for (int i = 0; i < 200 && !epipe; i++) {
        if (send(s, "zz", 2, MSG_NOSIGNAL) < 0) epipe = errno == EPIPE || errno == ECONNRESET;
        usleep(10000);
    }
    printf("writing to a closed peer fails: %d\n", epipe);
    close(s);
    close(l);
    close(ep);
    return 0;
}
