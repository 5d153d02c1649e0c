"""A CPython record table: builds N records (a dict of fields each), sorts them by two keys,
indexes them by city and sums a field per city; prints a digest. The kind of program users
bring (an in-memory table, pointer chasing through dicts and objects).

    python3 records.py [N]
"""
import hashlib
import random
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 150000
rng = random.Random(7)
cities = [f"city{i:03d}" for i in range(400)]
records = [{"id": i, "name": f"user{rng.randrange(10**9):09d}", "city": rng.choice(cities), "age": rng.randrange(18, 90), "score": rng.random() * 1000, "tags": [rng.randrange(50) for _ in range(3)]} for i in range(n)]
records.sort(key=lambda r: (r["city"], -r["score"]))
by_city = {}
for r in records:
    by_city.setdefault(r["city"], []).append(r)
totals = {c: sum(r["age"] for r in rs) for c, rs in by_city.items()}
top = [rs[0]["name"] for c, rs in sorted(by_city.items())]
h = hashlib.sha256()
for c in sorted(totals):
    h.update(f"{c}:{totals[c]}:{len(by_city[c])}".encode())
h.update("".join(top).encode())
print(len(records), h.hexdigest()[:16])
