// An LD_PRELOAD library that defines read(2) and readdir's getdents64 as the shim would have to
// (to touch a buffer in before the kernel writes to it), and counts the calls that reach it.
// Run a program under it to see which of the C library's own reads bypass an interposer.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static long reads, getdents;

ssize_t read(int fd, void *buf, size_t n) {
    static ssize_t (*real)(int, void *, size_t);
    if (!real)
        real = dlsym(RTLD_NEXT, "read");
    reads++;
    return real(fd, buf, n);
}

ssize_t getdents64(int fd, void *buf, size_t n) {
    static ssize_t (*real)(int, void *, size_t);
    if (!real)
        real = dlsym(RTLD_NEXT, "getdents64");
    getdents++;
    return real(fd, buf, n);
}

__attribute__((destructor)) static void report(void) {
    char b[96];
    int n = snprintf(b, sizeof b, "interposed read() calls: %ld, getdents64() calls: %ld\n", reads, getdents);
    write(2, b, n);
}
