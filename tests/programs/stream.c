/* STREAM (McCalpin's copy, scale, add and triad kernels) on three heap arrays, split across
 * threads. Usage: stream MIB_PER_ARRAY [ITERATIONS [THREADS [rates]]].
 * stdout: the validation of the arrays' final values, the same on every run and machine.
 * stderr, with "rates": one line per kernel with its best bandwidth, for the benchmarks. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double *a, *b, *c;
static size_t n;
static int threads;
static const double scalar = 3.0;

enum { COPY, SCALE, ADD, TRIAD, KERNELS };
static const char *names[KERNELS] = {"copy", "scale", "add", "triad"};
/* Arrays each kernel reads and writes, for its bytes moved. */
static const int arrays[KERNELS] = {2, 2, 3, 3};

struct part { int kernel; size_t lo, hi; };

static void *run(void *arg) {
    struct part *p = arg;
    switch (p->kernel) {
    case COPY: for (size_t j = p->lo; j < p->hi; j++) c[j] = a[j]; break;
    case SCALE: for (size_t j = p->lo; j < p->hi; j++) b[j] = scalar * c[j]; break;
    case ADD: for (size_t j = p->lo; j < p->hi; j++) c[j] = a[j] + b[j]; break;
    case TRIAD: for (size_t j = p->lo; j < p->hi; j++) a[j] = b[j] + scalar * c[j]; break;
    }
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void kernel(int k) {
    pthread_t tid[64];
    struct part parts[64];
    for (int t = 0; t < threads; t++) {
        parts[t] = (struct part){k, n * t / threads, n * (t + 1) / threads};
        if (t > 0 && pthread_create(&tid[t], 0, run, &parts[t])) { perror("pthread_create"); exit(2); }
    }
    run(&parts[0]);
    for (int t = 1; t < threads; t++) pthread_join(tid[t], 0);
}

static int check(const char *name, const double *x, double want) {
    double err = 0;
    for (size_t j = 0; j < n; j++) err += fabs(x[j] - want);
    err /= n;
    int ok = fabs(err / want) < 1e-13;
    printf("%s: %s (expected %.6e)\n", name, ok ? "valid" : "WRONG", want);
    return ok;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 16;
    int iters = argc > 2 ? atoi(argv[2]) : 5;
    threads = argc > 3 ? atoi(argv[3]) : 1;
    int rates = argc > 4 && !strcmp(argv[4], "rates");
    if (mib == 0 || iters < 1 || threads < 1 || threads > 64) {
        fprintf(stderr, "usage: stream MIB_PER_ARRAY [ITERATIONS [THREADS (1-64) [rates]]]\n");
        return 2;
    }
    n = (mib << 20) / sizeof(double);
    a = malloc(n * sizeof(double));
    b = malloc(n * sizeof(double));
    c = malloc(n * sizeof(double));
    if (!a || !b || !c) { perror("malloc"); return 2; }
    for (size_t j = 0; j < n; j++) { a[j] = 1.0; b[j] = 2.0; c[j] = 0.0; }
    double best[KERNELS];
    for (int k = 0; k < KERNELS; k++) best[k] = INFINITY;
    for (int i = 0; i < iters; i++)
        for (int k = 0; k < KERNELS; k++) {
            double t0 = now();
            kernel(k);
            double t = now() - t0;
            if (t < best[k]) best[k] = t;
        }
    /* What the arrays hold after `iters` rounds, computed on scalars as STREAM does. */
    double aj = 1.0, bj = 2.0, cj = 0.0;
    for (int i = 0; i < iters; i++) { cj = aj; bj = scalar * cj; cj = aj + bj; aj = bj + scalar * cj; }
    printf("stream: %zu MiB per array, %d iterations\n", mib, iters);
    int ok = check("a", a, aj) & check("b", b, bj) & check("c", c, cj);
    for (int k = 0; k < KERNELS && rates; k++)
        fprintf(stderr, "%s %.1f MB/s\n", names[k], arrays[k] * n * sizeof(double) / best[k] / 1e6);
    return ok ? 0 : 1;
}
