"""fsx-style file-system exerciser: a long random sequence of writes, appends, truncates,
reads, mmap reads, fsyncs, reopens and renames on one file in argv[1], every read checked
against a model of what the file must hold. Usage: fsx.py DIR SEED OPS MAXLEN.
Prints the operation count and a digest of the final contents; exits 1 at the first
difference, naming the operation and offset."""
import hashlib
import mmap
import os
import random
import sys

d, seed, ops, maxlen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
names = [os.path.join(d, "fsx.a"), os.path.join(d, "fsx.b")]
cur = 0
model = bytearray()
fd = os.open(names[cur], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)


def fail(i, what, off, got, want):
    at = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
    print(f"op {i}: {what} at offset {off}: differs from the model at byte {off + at} (got {len(got)} bytes, want {len(want)})")
    sys.exit(1)


for i in range(ops):
    op = rng.choices(["write", "append", "truncate", "read", "mapread", "fsync", "reopen", "rename"], [30, 10, 8, 30, 8, 4, 5, 5])[0]
    if op == "write":
        off = rng.randrange(0, maxlen)
        n = rng.randrange(1, min(65536, maxlen - off) + 1)
        data = rng.randbytes(n)
        os.pwrite(fd, data, off)
        if off > len(model):
            model.extend(bytes(off - len(model)))
        model[off:off + n] = data
    elif op == "append":
        data = rng.randbytes(rng.randrange(1, 9000))
        afd = os.open(names[cur], os.O_WRONLY | os.O_APPEND)
        os.write(afd, data)
        os.close(afd)
        model.extend(data)
    elif op == "truncate":
        size = rng.randrange(0, maxlen)
        os.ftruncate(fd, size)
        if size < len(model):
            del model[size:]
        else:
            model.extend(bytes(size - len(model)))
    elif op == "read":
        off = rng.randrange(0, max(1, len(model)))
        n = rng.randrange(1, 70000)
        got = os.pread(fd, n, off)
        want = bytes(model[off:off + n])
        if got != want:
            fail(i, "read", off, got, want)
    elif op == "mapread" and len(model) > 0:
        if os.fstat(fd).st_size != len(model):
            print(f"op {i}: size {os.fstat(fd).st_size} differs from the model's {len(model)}")
            sys.exit(1)
        m = mmap.mmap(fd, len(model), prot=mmap.PROT_READ)
        off = rng.randrange(0, len(model))
        n = rng.randrange(1, 20000)
        got = m[off:off + n]
        m.close()
        if got != bytes(model[off:off + n]):
            fail(i, "mapread", off, got, bytes(model[off:off + n]))
    elif op == "fsync":
        os.fsync(fd)
    elif op == "reopen":
        os.close(fd)
        fd = os.open(names[cur], os.O_RDWR)
    elif op == "rename":
        os.rename(names[cur], names[1 - cur])
        cur = 1 - cur

os.close(fd)
final = open(names[cur], "rb").read()
if final != bytes(model):
    fail(ops, "final read", 0, final, bytes(model))
print(f"fsx: {ops} operations matched the model; final size {len(final)}, sha256 {hashlib.sha256(final).hexdigest()[:16]}")
