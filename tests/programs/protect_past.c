/* Changes protections around a vNode's memory quota (200 MiB in the test): a reserve of
 * 512 MiB mapped inaccessible costs nothing; making 220 MiB of it writable is past the quota (not past an mComponent's 256 MiB);
 * 150 MiB writable is within it, and once made inaccessible again its room is free at once for
 * the next 150 MiB. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define MB (1UL << 20)

static const char *rw(unsigned char *p, size_t len) {
    if (mprotect(p, len, PROT_READ | PROT_WRITE) == 0)
        return "ok";
    return errno == ENOMEM ? "ENOMEM" : "other error";
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    unsigned char *p = mmap(0, 512 * MB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    printf("220 MiB writable: %s\n", rw(p, 220 * MB));
    const char *first = rw(p, 150 * MB);
    memset(p, 1, MB);
    int none = mprotect(p, 150 * MB, PROT_NONE);
    const char *second = rw(p + 256 * MB, 150 * MB);
    memset(p + 256 * MB, 2, MB);
    printf("150 MiB writable: %s, inaccessible again: %s, the next 150 MiB: %s, %d\n", first,
           none == 0 ? "ok" : "error", second, p[256 * MB] + p[257 * MB - 1]);
    return 0;
}
