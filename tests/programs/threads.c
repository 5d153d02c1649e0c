/* Several threads fault on the heap at once: each fills and checks its own slice, and all
 * of them update shared counters under a mutex. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 4
static size_t slice;
static unsigned char *heap;
static uint64_t total;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void *work(void *arg) {
    size_t t = (size_t)arg;
    unsigned char *a = heap + t * slice;
    for (int round = 0; round < 3; round++)
        for (size_t i = 0; i < slice; i += 512) a[i] = (unsigned char)(i / 512 + t + round);
    uint64_t s = 0;
    for (size_t i = 0; i < slice; i += 512) s += a[i];
    char *scratch = malloc(100000);
    for (int i = 0; i < 100000; i++) scratch[i] = (char)i;
    s += (unsigned char)scratch[99999];
    free(scratch);
    pthread_mutex_lock(&mu);
    total += s;
    pthread_mutex_unlock(&mu);
    return (void *)s;
}

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? strtoul(argv[1], 0, 10) : 32;
    slice = (mb << 20) / THREADS;
    heap = malloc(mb << 20);
    pthread_t th[THREADS];
    for (size_t t = 0; t < THREADS; t++) pthread_create(&th[t], 0, work, (void *)t);
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        printf("thread %d sum %llu\n", t, (unsigned long long)(uintptr_t)r);
    }
    printf("total %llu\n", (unsigned long long)total);
    return 0;
}
