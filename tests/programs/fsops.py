"""Every file operation a program expects, run in the directory given as argv[1]; prints one
line per step (results and errno names, never absolute paths) so that a run on a local
directory and a run on a vNode mount can be compared line by line."""
import errno
import mmap
import os
import stat
import sys

os.chdir(sys.argv[1])


def step(name, f):
    try:
        r = f()
        print(f"{name}: ok {r if r is not None else ''}".rstrip())
    except OSError as e:
        print(f"{name}: {errno.errorcode.get(e.errno, e.errno)}")


def write(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    fd = os.open(path, flags, 0o644)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


def read(path):
    with open(path, "rb") as f:
        return f.read()


step("mkdir", lambda: os.mkdir("d"))
step("mkdir again", lambda: os.mkdir("d"))
step("create", lambda: write("d/f", b"hello world\n"))
step("O_EXCL on existing", lambda: write("d/f", b"x", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
step("O_EXCL new", lambda: write("d/g", b"gee", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
step("open missing", lambda: os.open("d/missing", os.O_RDONLY))
step("create under a file", lambda: write("d/f/x", b"x"))
step("open dir for writing", lambda: os.open("d", os.O_WRONLY))
step("long name", lambda: write("n" * 256, b"x"))
step("name of 255", lambda: write("n" * 255, b"x"))
step("unlink 255", lambda: os.unlink("n" * 255))
step("rmdir non-empty", lambda: os.rmdir("d"))
step("unlink a dir", lambda: os.unlink("d"))
step("rmdir a file", lambda: os.rmdir("d/f"))
step("read", lambda: read("d/f"))


def append():
    fd = os.open("d/f", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"more\n")
    os.write(fd, b"and more\n")
    os.close(fd)
    return read("d/f")


step("append", append)


def positional():
    fd = os.open("d/p", os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(fd, b"ABCDEFGH", 100)
    os.pwrite(fd, b"xy", 2)
    a = os.pread(fd, 8, 100)
    b = os.pread(fd, 4, 0)
    end = os.lseek(fd, 0, os.SEEK_END)
    os.lseek(fd, 50, os.SEEK_SET)
    os.write(fd, b"mid")
    cur = os.lseek(fd, 0, os.SEEK_CUR)
    os.fsync(fd)
    size = os.fstat(fd).st_size
    os.close(fd)
    return (a, b, end, cur, size)


step("pread/pwrite/lseek/fsync", positional)


def truncate():
    os.truncate("d/p", 10)
    small = read("d/p")
    os.truncate("d/p", 5000)
    big = read("d/p")
    return (small, len(big), big[10:20], os.stat("d/p").st_size)


step("truncate", truncate)


def big_file():
    data = bytes((i * 7 + i // 4096) % 251 for i in range(3 << 20))
    write("d/big", data)
    back = read("d/big")
    fd = os.open("d/big", os.O_RDONLY)
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    mm = (m[:16], m[(3 << 20) - 16:], m[123456:123470])
    m.close()
    os.close(fd)
    return (back == data, len(back), mm)


step("3 MiB write, read and mmap", big_file)
step("stat", lambda: (stat.S_ISREG(os.stat("d/f").st_mode), os.stat("d/f").st_size, oct(os.stat("d/p").st_mode & 0o777)))
step("chmod", lambda: (os.chmod("d/p", 0o640), oct(os.stat("d/p").st_mode & 0o777))[1])
step("utime", lambda: (os.utime("d/f", (1000000000, 1234567890)), os.stat("d/f").st_mtime)[1])
step("readdir", lambda: sorted(os.listdir("d")))
step("rename file", lambda: os.rename("d/g", "d/h"))
step("rename over existing", lambda: (os.rename("d/h", "d/f"), read("d/f"))[1])
step("rename missing", lambda: os.rename("d/nothing", "d/x"))
step("mkdir tree", lambda: (os.makedirs("t/a/b"), write("t/a/b/leaf", b"leaf"))[1])
step("rename dir", lambda: (os.rename("t", "u"), read("u/a/b/leaf"), os.path.exists("t"))[1:])
step("rename dir into itself", lambda: os.rename("u", "u/a/inside"))
step("rename dir over non-empty dir", lambda: (os.mkdir("v"), os.rename("v", "u"))[1])
step("rename dir over empty dir", lambda: (os.rename("u/a/b", "v"), sorted(os.listdir("v")))[1])
step("rename file over dir", lambda: os.rename("d/f", "v"))


def unlink_open():
    fd = os.open("d/tmp", os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"still here")
    os.unlink("d/tmp")
    gone = os.path.exists("d/tmp")
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, 100)
    os.close(fd)
    return (gone, data)


step("unlink while open", unlink_open)
step("symlink", lambda: (os.symlink("f", "d/link"), os.readlink("d/link"), read("d/link"))[1:])
step("hard link", lambda: os.link("d/f", "d/hard"))
step("walk", lambda: sorted((r, sorted(ds), sorted(fs)) for r, ds, fs in os.walk(".")))
step("cleanup", lambda: [os.unlink(os.path.join("d", f)) for f in sorted(os.listdir("d"))] and os.rmdir("d"))
step("after cleanup", lambda: os.path.exists("d"))
