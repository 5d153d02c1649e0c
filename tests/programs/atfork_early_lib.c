/* A shared library whose constructor registers fork handlers before it allocates anything
 * (it runs before the preloaded shim's constructor), and whose child handler then writes to
 * heap memory it allocated later. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static char *state;

static void in_child(void) {
    if (state) strcpy(state, "rewritten by the library's child handler");
}

__attribute__((constructor)) static void early(void) {
    pthread_atfork(NULL, NULL, in_child);
}

const char *early_state(void) {
    if (!state) {
        state = malloc(64);
        strcpy(state, "written in the parent");
    }
    return state;
}
