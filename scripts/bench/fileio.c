/* Single-threaded 4 KiB file I/O, as in LegoOS figure 9.
 *
 *   fileio create    PATH FILE_MIB        write the file sequentially (1 MiB writes), fsync
 *   fileio seqread   PATH FILE_MIB OPS    OPS sequential 4 KiB reads from the start
 *   fileio randread  PATH FILE_MIB OPS    OPS 4 KiB reads at random aligned offsets
 *   fileio seqwrite  PATH FILE_MIB OPS    OPS sequential 4 KiB writes, each followed by fsync
 *   fileio randwrite PATH FILE_MIB OPS    OPS random 4 KiB writes, each followed by fsync
 *
 * Prints one JSON line: ops, seconds, MB/s and per-operation latency percentiles (µs). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: fileio create|seqread|randread|seqwrite|randwrite PATH FILE_MIB [OPS]\n");
        return 2;
    }
    const char *mode = argv[1], *path = argv[2];
    long blocks = atol(argv[3]) * 256;
    long ops = argc > 4 ? atol(argv[4]) : 0;
    if (!strcmp(mode, "create")) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) { perror("open"); return 1; }
        char *buf = malloc(1 << 20);
        for (long i = 0; i < blocks / 256; i++) {
            memset(buf, (int)(i & 0xff), 1 << 20);
            if (write(fd, buf, 1 << 20) != 1 << 20) { perror("write"); return 1; }
        }
        if (fsync(fd)) { perror("fsync"); return 1; }
        close(fd);
        printf("{\"created_mib\": %ld}\n", blocks / 256);
        return 0;
    }
    int writing = strstr(mode, "write") != NULL, random = !strncmp(mode, "rand", 4);
    int fd = open(path, writing ? O_RDWR : O_RDONLY);
    if (fd < 0) { perror("open"); return 1; }
    char buf[4096];
    memset(buf, 0x5a, sizeof buf);
    double *lat = malloc(sizeof(double) * ops);
    uint64_t x = 88172645463325252ull;
    double t0 = now();
    for (long i = 0; i < ops; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        off_t off = (random ? (off_t)(x % blocks) : i % blocks) * 4096;
        double s = now();
        if (writing) {
            if (pwrite(fd, buf, 4096, off) != 4096) { perror("pwrite"); return 1; }
            if (fsync(fd)) { perror("fsync"); return 1; }
        } else if (pread(fd, buf, 4096, off) != 4096) {
            perror("pread");
            return 1;
        }
        lat[i] = (now() - s) * 1e6;
    }
    double secs = now() - t0;
    qsort(lat, ops, sizeof(double), cmp);
    printf("{\"mode\": \"%s\", \"ops\": %ld, \"seconds\": %.6f, \"mb_per_s\": %.3f, \"lat_us_p50\": %.2f, \"lat_us_p99\": %.2f}\n",
           mode, ops, secs, ops * 4096.0 / 1e6 / secs, lat[ops / 2], lat[(long)(ops * 0.99)]);
    close(fd);
    return 0;
}
