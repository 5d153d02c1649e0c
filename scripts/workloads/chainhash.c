/* A chained hash table in C, the way a C service keeps an index: N nodes malloc'd one by one
 * and linked into buckets in random order, then N*R lookups of random keys (each a walk down a
 * chain: pointer chasing, one cache line per node), a third of them updating the node found.
 * Prints a digest of the table.
 *
 *     chainhash N R */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node {
    struct node *next;
    uint64_t key, value;
    char name[48];
};

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], 0, 10) : 1000000;
    size_t rounds = argc > 2 ? strtoul(argv[2], 0, 10) : 4;
    size_t buckets = n / 2 + 1;
    struct node **table = calloc(buckets, sizeof *table);
    if (!table) return 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = mix(i + 1);
        struct node *e = malloc(sizeof *e);
        if (!e) return 1;
        e->key = key;
        e->value = i;
        snprintf(e->name, sizeof e->name, "node-%zu-%016llx", i, (unsigned long long)key);
        e->next = table[key % buckets];
        table[key % buckets] = e;
    }
    uint64_t found = 0, sum = 0;
    for (size_t j = 0; j < n * rounds; j++) {
        uint64_t key = mix(mix(j) % n + 1);
        for (struct node *e = table[key % buckets]; e; e = e->next) {
            if (e->key == key) {
                found++;
                sum += e->value + (unsigned char)e->name[5];
                if (j % 3 == 0) e->value += j;
                break;
            }
        }
    }
    uint64_t digest = 0;
    for (size_t b = 0; b < buckets; b++)
        for (struct node *e = table[b]; e; e = e->next) digest = digest * 31 + e->value + e->key;
    printf("nodes %zu lookups %zu found %llu sum %llu digest %016llx\n", n, n * rounds, (unsigned long long)found, (unsigned long long)sum, (unsigned long long)digest);
    return 0;
}
