/* The network micro-benchmark of the nComponent paper (section 4.2): a TCP client and its
 * server, the client run natively or under splitos, the server on a plain Linux host.
 *
 *   netbench server PORT
 *   netbench rr HOST PORT SIZE N        round trips of SIZE bytes each way: p50, p99, mean (us)
 *   netbench stream HOST PORT SIZE MIB  MIB MiB sent in SIZE-byte writes: MB/s
 *   netbench connect HOST PORT N        connect and close N times: p50, p99 (us)
 *   netbench userver PORT               a UDP echo server
 *   netbench urr HOST PORT SIZE N       UDP round trips of SIZE-byte datagrams: p50, p99, mean
 *                                       (us), and how many were lost (sent again after 1 s)
 * Each client prints one JSON line. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int full(int fd, char *b, size_t n, int reading) {
    for (size_t d = 0; d < n;) {
        ssize_t k = reading ? read(fd, b + d, n - d) : write(fd, b + d, n - d);
        if (k <= 0) return -1;
        d += k;
    }
    return 0;
}

/* A connection starts with its mode and size: 'r' echoes SIZE-byte messages, 's' sinks
 * bytes until the client shuts down writing and answers with one byte, 'c' just closes. */
static void *serve(void *arg) {
    int c = (int)(long)arg, one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char mode;
    unsigned size;
    if (full(c, &mode, 1, 1) || full(c, (char *)&size, 4, 1) || size > (1u << 24)) goto out;
    char *b = malloc(size ? size : 1);
    if (mode == 'r')
        while (!full(c, b, size, 1) && !full(c, b, size, 0)) {}
    if (mode == 's') {
        while (read(c, b, size) > 0) {}
        full(c, "k", 1, 0);
    }
    free(b);
out:
    close(c);
    return NULL;
}

static int dial(const char *host, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a)) {
        perror("connect");
        exit(1);
    }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *t, int n, size_t size) {
    qsort(t, n, sizeof *t, cmp);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    printf("{\"mode\":\"%s\",\"size\":%zu,\"n\":%d,\"p50_us\":%.2f,\"p99_us\":%.2f,\"mean_us\":%.2f}\n", what, size, n, t[n / 2], t[n * 99 / 100], sum / n);
}

static int udp_rr(const char *host, int port, unsigned size, int n) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    struct timeval tv = {1, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char *b = calloc(size, 1);
    double *t = malloc(n * sizeof *t);
    int lost = 0;
    for (int i = 0; i < n; i++) {
        memcpy(b, &i, sizeof i);
        double t0 = now_us();
        for (;;) {
            if (sendto(s, b, size, 0, (struct sockaddr *)&a, sizeof a) != (ssize_t)size) return 1;
            int got = -1;
            ssize_t k;
            /* An answer to an earlier, lost try is skipped. */
            while ((k = recv(s, b, size, 0)) == (ssize_t)size && (memcpy(&got, b, sizeof got), got != i))
                ;
            if (k == (ssize_t)size) break;
            lost++;
            memcpy(b, &i, sizeof i);
        }
        t[i] = now_us() - t0;
    }
    report("udp_rr", t, n, size);
    fprintf(stderr, "lost %d\n", lost);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "userver")) {
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
        if (bind(s, (struct sockaddr *)&a, sizeof a)) {
            perror("userver");
            return 1;
        }
        static char b[65536];
        for (;;) {
            struct sockaddr_in from;
            socklen_t len = sizeof from;
            ssize_t k = recvfrom(s, b, sizeof b, 0, (struct sockaddr *)&from, &len);
            if (k >= 0) sendto(s, b, k, 0, (struct sockaddr *)&from, len);
        }
    }
    if (argc == 6 && !strcmp(argv[1], "urr")) return udp_rr(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    if (argc == 3 && !strcmp(argv[1], "server")) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
        if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 64)) {
            perror("server");
            return 1;
        }
        for (;;) {
            int c = accept(l, NULL, NULL);
            pthread_t t;
            if (c >= 0 && !pthread_create(&t, NULL, serve, (void *)(long)c)) pthread_detach(t);
        }
    }
    if (argc != 6 && !(argc == 5 && !strcmp(argv[1], "connect"))) {
        fprintf(stderr, "usage: see the top of netbench.c\n");
        return 2;
    }
    const char *host = argv[2];
    int port = atoi(argv[3]);
    if (!strcmp(argv[1], "connect")) {
        int n = atoi(argv[4]);
        double *t = malloc(n * sizeof *t);
        for (int i = 0; i < n; i++) {
            double t0 = now_us();
            int s = dial(host, port);
            t[i] = now_us() - t0;
            full(s, "c\0\0\0\0", 5, 0);
            close(s);
        }
        report("connect", t, n, 0);
        return 0;
    }
    unsigned size = atoi(argv[4]);
    char *b = calloc(size, 1);
    int s = dial(host, port);
    char hdr[5] = {argv[1][0] == 'r' ? 'r' : 's'};
    memcpy(hdr + 1, &size, 4);
    full(s, hdr, 5, 0);
    if (!strcmp(argv[1], "rr")) {
        int n = atoi(argv[5]);
        double *t = malloc(n * sizeof *t);
        for (int i = 0; i < n; i++) {
            double t0 = now_us();
            if (full(s, b, size, 0) || full(s, b, size, 1)) return 1;
            t[i] = now_us() - t0;
        }
        report("rr", t, n, size);
    } else {
        size_t total = (size_t)atoi(argv[5]) << 20;
        double t0 = now_us();
        for (size_t d = 0; d < total; d += size)
            if (full(s, b, size, 0)) return 1;
        shutdown(s, SHUT_WR);
        char k;
        if (full(s, &k, 1, 1)) return 1;
        double us = now_us() - t0;
        printf("{\"mode\":\"stream\",\"size\":%u,\"bytes\":%zu,\"seconds\":%.4f,\"mb_per_s\":%.2f}\n", size, total, us / 1e6, total / us);
    }
    close(s);
    return 0;
}
