// Reads a file with fgets and a directory with readdir: both go to the kernel from inside the
// C library, into buffers the C library allocated with malloc (the shim's heap region).
#include <dirent.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 3)
        return fprintf(stderr, "usage: libc_reads FILE DIR\n"), 2;
    FILE *f = fopen(argv[1], "r");
    char line[256];
    long lines = 0, entries = 0;
    while (f && fgets(line, sizeof line, f))
        lines++;
    DIR *d = opendir(argv[2]);
    while (d && readdir(d))
        entries++;
    printf("%ld lines, %ld directory entries\n", lines, entries);
    return 0;
}
