#include <stdio.h>
int main(void) { puts("hello from a static binary"); return 0; }
