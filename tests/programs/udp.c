/* UDP socket calls, on loopback: the same output natively and under splitos (where the
 * sockets live on the nComponent). Usage: udp PORT (PORT and PORT+1 are used). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void check(int ok, const char *what) {
    if (!ok) {
        printf("FAILED %s: %s\n", what, strerror(errno));
        exit(1);
    }
}

static struct sockaddr_in at(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    return a;
}

static int port_of(int fd) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    check(getsockname(fd, (struct sockaddr *)&a, &len) == 0, "getsockname");
    return ntohs(a.sin_port);
}

/* Receives one datagram on fd and says what and from whom, relative to the expected sender. */
static void take(int fd, const char *label, int from_port) {
    char buf[70000];
    struct sockaddr_in src;
    socklen_t len = sizeof src;
    ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&src, &len);
    check(n >= 0, label);
    char ip[32];
    inet_ntop(AF_INET, &src.sin_addr, ip, sizeof ip);
    printf("%s: %zd bytes '%.*s' from %s, %s, addrlen %u\n", label, n, (int)(n < 20 ? n : 20), buf, ip,
           ntohs(src.sin_port) == from_port ? "the expected port" : "ANOTHER PORT", len);
}

/* A lost datagram fails the run rather than hanging it. */
static int bounded(int fd) {
    struct timeval tv = {10, 0};
    check(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0, "SO_RCVTIMEO");
    return fd;
}

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 9400;
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in sa = at(port);

    int s = socket(AF_INET, SOCK_DGRAM, 0);
    check(s >= 0, "socket");
    bounded(s);
    check(bind(s, (struct sockaddr *)&sa, sizeof sa) == 0, "bind");
    printf("server bound: %s\n", port_of(s) == port ? "yes" : "no");
    int type = 0;
    socklen_t tl = sizeof type;
    check(getsockopt(s, SOL_SOCKET, SO_TYPE, &type, &tl) == 0, "SO_TYPE");
    printf("SO_TYPE is SOCK_DGRAM: %d\n", type == SOCK_DGRAM);
    struct sockaddr_in again = at(port);
    int s2 = socket(AF_INET, SOCK_DGRAM, 0);
    printf("second bind: %s\n", bind(s2, (struct sockaddr *)&again, sizeof again) == 0 ? "ok" : strerror(errno));
    close(s2);

    /* An unbound client: the first sendto gives it a port. */
    int c = bounded(socket(AF_INET, SOCK_DGRAM, 0));
    check(sendto(c, "hello", 5, 0, (struct sockaddr *)&sa, sizeof sa) == 5, "sendto");
    int cport = port_of(c);
    printf("client has a port: %d\n", cport > 0);
    take(s, "server got", cport);

    /* The server answers its source, by the address recvfrom gave. */
    struct sockaddr_in ca = at(cport);
    check(sendto(s, "welcome", 7, 0, (struct sockaddr *)&ca, sizeof ca) == 7, "sendto back");
    take(c, "client got", port);

    /* Datagram boundaries: sizes kept; a short buffer truncates (MSG_TRUNC). */
    static char big[60000];
    memset(big, 'x', sizeof big);
    int sizes[] = {1, 1000, 60000};
    for (int i = 0; i < 3; i++)
        check(sendto(c, big, sizes[i], 0, (struct sockaddr *)&sa, sizeof sa) == sizes[i], "sendto sizes");
    for (int i = 0; i < 3; i++) {
        char buf[65536];
        ssize_t n = recv(s, buf, sizeof buf, 0);
        printf("datagram %d: %zd bytes\n", i, n);
    }
    check(sendto(c, "truncated", 9, 0, (struct sockaddr *)&sa, sizeof sa) == 9, "sendto trunc");
    {
        char small[4];
        struct sockaddr_in src;
        struct iovec iov = {small, sizeof small};
        struct msghdr m = {.msg_name = &src, .msg_namelen = sizeof src, .msg_iov = &iov, .msg_iovlen = 1};
        ssize_t n = recvmsg(s, &m, 0);
        printf("recvmsg: %zd bytes '%.4s', MSG_TRUNC %d, from the client %d\n", n, small, !!(m.msg_flags & MSG_TRUNC), ntohs(src.sin_port) == cport && m.msg_namelen == sizeof src);
    }

    /* Too big for UDP. */
    static char huge[70000];
    ssize_t r = sendto(c, huge, sizeof huge, 0, (struct sockaddr *)&sa, sizeof sa);
    printf("70000 bytes: %s\n", r < 0 ? strerror(errno) : "sent");

    /* Non-blocking and timeouts. */
    char buf[100];
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
    r = recv(s, buf, sizeof buf, 0);
    printf("non-blocking recv: %zd %s\n", r, strerror(errno));
    fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
    struct timeval tv = {0, 200000};
    check(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0, "SO_RCVTIMEO");
    r = recv(s, buf, sizeof buf, 0);
    printf("recv with a timeout: %zd %s\n", r, strerror(errno));
    bounded(s);

    /* poll sees a datagram come. */
    struct pollfd p = {s, POLLIN, 0};
    printf("poll before: %d\n", poll(&p, 1, 100));
    check(sendto(c, "ping", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4, "sendto ping");
    int ready = poll(&p, 1, 5000);
    printf("poll after: %d, POLLIN %d\n", ready, !!(p.revents & POLLIN));
    take(s, "polled", cport);

    /* A connected socket: write and read, only its peer reaches it. */
    int k = bounded(socket(AF_INET, SOCK_DGRAM, 0));
    check(connect(k, (struct sockaddr *)&sa, sizeof sa) == 0, "connect");
    struct sockaddr_in peer;
    socklen_t pl = sizeof peer;
    check(getpeername(k, (struct sockaddr *)&peer, &pl) == 0, "getpeername");
    printf("peer is the server: %d\n", ntohs(peer.sin_port) == port);
    check(write(k, "written", 7) == 7, "write");
    take(s, "server got the write", port_of(k));
    struct sockaddr_in ka = at(port_of(k));
    check(sendto(c, "stranger", 8, 0, (struct sockaddr *)&ka, sizeof ka) == 8, "sendto stranger");
    check(sendto(s, "answer", 6, 0, (struct sockaddr *)&ka, sizeof ka) == 6, "sendto answer");
    ssize_t n = read(k, buf, sizeof buf);
    printf("connected socket read: '%.*s'\n", (int)n, buf);
    struct pollfd kp = {k, POLLIN, 0};
    printf("nothing more for it (the stranger's was not its peer's): %d\n", poll(&kp, 1, 300));
    struct sockaddr un = {.sa_family = AF_UNSPEC};
    check(connect(k, &un, sizeof un) == 0, "disconnect");
    int gp = getpeername(k, (struct sockaddr *)&peer, &pl);
    printf("after AF_UNSPEC: getpeername %d %s\n", gp, strerror(errno));

    /* sendmmsg and recvmmsg. */
    struct mmsghdr out[4], in[4];
    char obufs[4][8], ibufs[4][8];
    struct iovec oiov[4], iiov[4];
    struct sockaddr_in srcs[4];
    for (int i = 0; i < 4; i++) {
        snprintf(obufs[i], sizeof obufs[i], "mm%d", i);
        oiov[i] = (struct iovec){obufs[i], 3};
        out[i] = (struct mmsghdr){.msg_hdr = {.msg_name = &sa, .msg_namelen = sizeof sa, .msg_iov = &oiov[i], .msg_iovlen = 1}};
        iiov[i] = (struct iovec){ibufs[i], sizeof ibufs[i]};
        in[i] = (struct mmsghdr){.msg_hdr = {.msg_name = &srcs[i], .msg_namelen = sizeof srcs[i], .msg_iov = &iiov[i], .msg_iovlen = 1}};
    }
    printf("sendmmsg: %d\n", sendmmsg(c, out, 4, 0));
    int got = 0;
    while (got < 4) {
        int r = recvmmsg(s, in + got, 4 - got, MSG_WAITFORONE, NULL);
        check(r > 0, "recvmmsg");
        got += r;
    }
    for (int i = 0; i < 4; i++)
        printf("recvmmsg %d: '%.*s' from the client %d\n", i, (int)in[i].msg_len, ibufs[i], ntohs(srcs[i].sin_port) == cport);

    /* A burst: every datagram arrives, in order. */
    for (int i = 0; i < 200; i++) {
        char m[100];
        memset(m, 0, sizeof m);
        snprintf(m, sizeof m, "%d", i);
        check(sendto(c, m, sizeof m, 0, (struct sockaddr *)&sa, sizeof sa) == sizeof m, "burst");
    }
    int in_order = 1, count = 0;
    tv.tv_sec = 2;
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (int i = 0; i < 200; i++) {
        char m[100];
        if (recv(s, m, sizeof m, 0) != sizeof m)
            break;
        count++;
        in_order &= atoi(m) == i;
    }
    printf("burst: %d of 200, in order %d\n", count, in_order);

    /* A forked child sends on the inherited socket. */
    pid_t child = fork();
    if (child == 0) {
        sendto(c, "from the child", 14, 0, (struct sockaddr *)&sa, sizeof sa);
        _exit(0);
    }
    waitpid(child, NULL, 0);
    take(s, "server got", cport);

    /* IPv6 on loopback. */
    int s6 = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(port + 1), .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    if (s6 < 0 || bind(s6, (struct sockaddr *)&a6, sizeof a6) != 0) {
        printf("IPv6: %s\n", strerror(errno));
    } else {
        bounded(s6);
        int c6 = socket(AF_INET6, SOCK_DGRAM, 0);
        check(sendto(c6, "six", 3, 0, (struct sockaddr *)&a6, sizeof a6) == 3, "sendto6");
        struct sockaddr_in6 src6;
        socklen_t l6 = sizeof src6;
        n = recvfrom(s6, buf, sizeof buf, 0, (struct sockaddr *)&src6, &l6);
        char ip[64];
        inet_ntop(AF_INET6, &src6.sin6_addr, ip, sizeof ip);
        printf("IPv6: '%.*s' from %s, family %d, addrlen %u\n", (int)n, buf, ip, src6.sin6_family == AF_INET6, l6);
    }
    printf("done\n");
    return 0;
}
