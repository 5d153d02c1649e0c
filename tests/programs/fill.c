/* Fills memory 8 MiB at a time, writing every byte, until it has MIB MiB or malloc returns NULL,
 * and says which ("filled N MiB" or "filled N MiB, then malloc returned NULL"). With a second
 * argument "wait", it then waits until its stdin closes before it frees the blocks and says
 * "freed". With "exec PROG ARG...", it then runs PROG in its place, holding the blocks until then.
 * Usage: fill MIB [wait | exec PROG ARG...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    char *blocks[4096];
    size_t n = 0;
    int null = 0;
    while (n * 8 < mib && n < 4096) {
        char *p = malloc(8 << 20);
        if (!p) {
            null = 1;
            break;
        }
        memset(p, (int)(n % 251) + 1, 8 << 20);
        blocks[n++] = p;
    }
    printf("filled %zu MiB%s\n", n * 8, null ? ", then malloc returned NULL" : "");
    fflush(stdout);
    if (argc > 3 && strcmp(argv[2], "exec") == 0) {
        execv(argv[3], argv + 3);
        perror("execv");
        return 127;
    }
    if (argc > 2 && strcmp(argv[2], "wait") == 0) {
        char c;
        while (read(0, &c, 1) > 0) {}
    }
    for (size_t i = 0; i < n; i++) free(blocks[i]);
    printf("freed\n");
    return 0;
}
