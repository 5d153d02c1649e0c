"""A CPython heap (dict, lists, strings) or an in-memory sqlite3 database built, changed and read
back in three phases; after each of the first two it prints a line and waits for a line on stdin,
so that a test can act on the cluster while the data lives on mComponents."""
import sqlite3
import sys
import zlib

N = int(sys.argv[2]) if len(sys.argv) > 2 else 120000


def wait():
    sys.stdout.flush()
    sys.stdin.readline()


def with_dict():
    d = {i: ("v%d-" % (i * 7919 % 100003)) * 3 for i in range(N)}
    lists = [list(range(i % 50)) for i in range(N // 4)]
    print("phase 1", len(d), sum(len(v) for v in d.values()), sum(map(sum, lists)))
    wait()
    for i in range(0, N, 3):
        d[i] = d[i].upper() + str(i)
    for i in range(0, N, 7):
        del d[i]
    lists.reverse()
    print("phase 2", len(d), sum(len(v) for v in d.values()), sum(l[-1] for l in lists if l))
    wait()
    print("phase 3", len(d), zlib.crc32(repr(sorted(d.items())[:1000]).encode()), sum(len(v) for v in d.values()))


def with_sqlite():
    db = sqlite3.connect(":memory:")
    db.execute("pragma cache_size = -65536")
    db.execute("create table t (k integer primary key, grp integer, name text, v real)")
    db.executemany("insert into t values (?, ?, ?, ?)", ((i, i % 97, "name-%d" % (i * 31 % 9973), i * 0.5) for i in range(N)))
    db.execute("create index by_grp on t (grp, name)")
    print("phase 1", db.execute("select count(*), sum(v), count(distinct name) from t").fetchone())
    wait()
    db.execute("update t set v = v * 2 + grp where k % 3 = 0")
    db.execute("delete from t where k % 7 = 0")
    print("phase 2", db.execute("select count(*), sum(v), max(name) from t").fetchone())
    wait()
    print("phase 3", db.execute("select grp, count(*), sum(v) from t group by grp order by grp limit 5").fetchall())


{"dict": with_dict, "sqlite": with_sqlite}[sys.argv[1]]()
