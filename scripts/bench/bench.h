/* What the C benchmark programs of scripts/bench share. */
#ifndef SPLITOS_BENCH_H
#define SPLITOS_BENCH_H
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static inline void die(const char *what) {
    perror(what);
    exit(1);
}
#endif
