#!/bin/sh
# Builds the experiments into a temporary directory and runs them all (needs root, or
# vm.unprivileged_userfaultfd=1, and gcc). See README.md for what each shows.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -O2 -Wall -o "$out/probe" "$here/probe.c" -lpthread
gcc -O2 -Wall -o "$out/latency" "$here/latency.c" -lpthread
gcc -O2 -Wall -shared -fPIC -o "$out/count_read.so" "$here/count_read.c" -ldl
gcc -O2 -Wall -o "$out/libc_reads" "$here/libc_reads.c"

for mode in uffd sigbus; do
    echo "== accesses, $mode"
    "$out/probe" $mode
    "$out/probe" $mode altstack 2>/dev/null
    echo "   (altstack run exit status $?)"
done

echo "== which of the C library's reads an LD_PRELOAD interposer sees"
LD_PRELOAD="$out/count_read.so" "$out/libc_reads" /etc/services /etc

echo "== fault latency seen by the faulting thread (noisy on a shared machine)"
for mode in uffd-spin uffd-sleep uffd-buddy slot-spin slot-sleep self; do
    "$out/latency" $mode 2000 3
done
echo "-- program and server pinned to different CPUs"
for mode in uffd-spin uffd-sleep slot-spin slot-sleep; do
    LATENCY_PIN=1 "$out/latency" $mode 2000 3
done
echo "-- program and server pinned to the same CPU"
for mode in uffd-spin uffd-sleep slot-sleep; do
    LATENCY_PIN=same "$out/latency" $mode 2000 3
done
