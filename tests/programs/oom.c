/* Allocates until malloc fails, then proves the program (and the cluster) carry on. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    size_t limit_mb = argc > 1 ? strtoul(argv[1], 0, 10) : 4096;
    void *blocks[8192];
    size_t got = 0;
    while (got < limit_mb && got < 8192) {
        void *p = malloc(1 << 20);
        if (!p) break;
        memset(p, 1, 4096);
        blocks[got++] = p;
    }
    int failed = got < limit_mb;
    printf("allocated %s; malloc %s%s\n", got > 0 ? "some" : "none", failed ? "returned NULL" : "never failed",
           failed && errno == ENOMEM ? " with ENOMEM" : "");
    for (size_t i = 0; i < got; i++) free(blocks[i]);
    char *after = malloc(1 << 16);
    memset(after, 7, 1 << 16);
    printf("after freeing: malloc works: %d\n", after != NULL && after[100] == 7);
    return 0;
}
