"""A real Python workload for the main job: generate a deterministic corpus, count words,
build bigram tables and print a summary. Its heap (tens of MiB of str and dict objects) is
what splitos puts on mComponents."""
import collections
import hashlib
import random
import sys

n_words = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
rng = random.Random(42)
vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10))) for _ in range(50_000)]
corpus = [vocab[int(len(vocab) * rng.random() ** 3)] for _ in range(n_words)]
counts = collections.Counter(corpus)
bigrams = collections.Counter(zip(corpus, corpus[1:]))
index = collections.defaultdict(list)
for pos, w in enumerate(corpus):
    index[w].append(pos)
digest = hashlib.sha256(" ".join(sorted(counts)).encode()).hexdigest()[:16]
print(f"words={len(corpus)} distinct={len(counts)} bigrams={len(bigrams)}")
print("top5:", ", ".join(f"{w}:{c}" for w, c in counts.most_common(5)))
print(f"longest posting list: {max(len(v) for v in index.values())} vocabulary digest={digest}")
