/* A chained hash table of malloc'd nodes, built, changed and read back in three phases. After
 * each of the first two it prints a line and waits for a line on stdin, so that a test can
 * act on the cluster (kill a component) while the table lives on mComponents. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node {
    struct node *next;
    uint64_t key, value;
    char name[40];
};

static struct node **table;
static size_t buckets;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static struct node *find(uint64_t key) {
    for (struct node *n = table[mix(key) % buckets]; n; n = n->next)
        if (n->key == key) return n;
    return NULL;
}

static uint64_t digest(size_t keys, size_t *count) {
    uint64_t s = 0;
    *count = 0;
    for (uint64_t k = 0; k < keys; k++) {
        struct node *n = find(k);
        if (!n) continue;
        (*count)++;
        s = s * 1000003 + n->value + (uint64_t)strlen(n->name) + (uint64_t)(unsigned char)n->name[3];
    }
    return s;
}

static void wait_line(void) {
    fflush(stdout);
    int c;
    while ((c = getchar()) != EOF && c != '\n') {}
}

int main(int argc, char **argv) {
    size_t keys = argc > 1 ? strtoul(argv[1], 0, 10) : 300000;
    buckets = keys / 2 + 1;
    table = calloc(buckets, sizeof *table);
    for (uint64_t k = 0; k < keys; k++) {
        struct node *n = malloc(sizeof *n);
        n->key = k;
        n->value = mix(k) & 0xffffff;
        snprintf(n->name, sizeof n->name, "key-%llu-%llx", (unsigned long long)k, (unsigned long long)mix(k + 1));
        size_t b = mix(k) % buckets;
        n->next = table[b];
        table[b] = n;
    }
    size_t count;
    uint64_t d = digest(keys, &count);
    printf("phase 1 %zu %llu\n", count, (unsigned long long)d);
    wait_line();
    for (uint64_t k = 0; k < keys; k += 3) find(k)->value += k;
    for (uint64_t k = 0; k < keys; k += 7) {
        struct node **p = &table[mix(k) % buckets];
        while ((*p)->key != k) p = &(*p)->next;
        struct node *gone = *p;
        *p = gone->next;
        free(gone);
    }
    d = digest(keys, &count);
    printf("phase 2 %zu %llu\n", count, (unsigned long long)d);
    wait_line();
    d = digest(keys, &count);
    printf("phase 3 %zu %llu\n", count, (unsigned long long)d);
    return 0;
}
