/* The kernel itself reads and writes heap pages that are not resident: read(2) into and
 * write(2) from buffers far larger than the ExCache. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "kernelio.dat";
    size_t n = (argc > 2 ? strtoul(argv[2], 0, 10) : 24) << 20;
    unsigned char *out = malloc(n), *in = malloc(n);
    for (size_t i = 0; i < n; i++) out[i] = (unsigned char)(i * 13 + (i >> 12));
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
    size_t done = 0;
    while (done < n) { ssize_t w = write(fd, out + done, n - done); if (w <= 0) { perror("write"); return 1; } done += w; }
    lseek(fd, 0, SEEK_SET);
    done = 0;
    while (done < n) { ssize_t r = read(fd, in + done, n - done); if (r <= 0) { perror("read"); return 1; } done += r; }
    close(fd);
    unlink(path);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ in[i]) * 1099511628211ull;
    printf("bytes=%zu equal=%d fnv=%llu\n", n, memcmp(in, out, n) == 0, (unsigned long long)h);
    return 0;
}
