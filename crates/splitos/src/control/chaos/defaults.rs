//! What `splitos chaos` runs when told nothing else: its cluster and its workloads.

pub(super) const DEFAULT_CONFIG: &str = r#"[cluster]
vregion_size = "4M"

[[pcomponent]]
excache = "16M"

[[scomponent]]

[[mcomponent]]
[[mcomponent]]
[[mcomponent]]
[[mcomponent]]
"#;

/// The default workloads: a CPython heap of about 60 MiB through a 16 MiB ExCache; a shell
/// pipeline of C programs (forks, pipes, execs); CPython threads; a file of 4 MiB written in
/// the vNode's file system with an fsync every MiB, read back and removed (natively, in a
/// temporary directory); stock memcached holding 20,000 values of 1 KiB under three seconds of
/// `splitos loadgen`, which checks every value it reads against the one it stored and prints
/// how many differed (`{splitos}`: this executable).
pub(super) const DEFAULT_WORKLOADS: [(&str, &str); 5] = [
    (
        "cpython-heap",
        "python3 -c 'import hashlib\nd = {i: str(i * 7) * 3 for i in range(300000)}\nprint(hashlib.sha256(\"\".join(d[k] for k in sorted(d, key=lambda k: d[k])).encode()).hexdigest())'",
    ),
    ("c-pipeline", "seq 1 400000 | sort -r | md5sum"),
    (
        "cpython-threads",
        "python3 -c 'import threading\nr = [0] * 4\ndef w(i):\n    r[i] = sum(len(str(x * (i + 1))) for x in range(150000))\nt = [threading.Thread(target=w, args=(i,)) for i in range(4)]\n[x.start() for x in t]\n[x.join() for x in t]\nprint(r)'",
    ),
    (
        "files",
        "python3 -c 'import hashlib, os, tempfile\nwith tempfile.TemporaryDirectory(dir=os.environ.get(\"SPLITOS_VNODE_DIR\")) as t:\n    p = os.path.join(t, \"f\")\n    with open(p, \"wb\") as f:\n        for i in range(64):\n            f.write(hashlib.sha256(str(i).encode()).digest() * 2048)\n            if i % 16 == 15:\n                f.flush()\n                os.fsync(f.fileno())\n    with open(p, \"rb\") as f:\n        print(hashlib.sha256(f.read()).hexdigest())'",
    ),
    (
        "memcached",
        "python3 -c 'import getpass, json, socket, subprocess, sys, time\ns = socket.socket()\ns.bind((\"127.0.0.1\", 0))\nport = s.getsockname()[1]\ns.close()\nm = subprocess.Popen([\"memcached\", \"-l\", \"127.0.0.1\", \"-p\", str(port), \"-U\", \"0\", \"-m\", \"64\", \"-t\", \"2\", \"-u\", getpass.getuser()])\ntry:\n    for _ in range(100):\n        try:\n            socket.create_connection((\"127.0.0.1\", port), 1).close()\n            break\n        except OSError:\n            time.sleep(0.1)\n    r = subprocess.run([sys.argv[1], \"loadgen\", \"--server\", \"127.0.0.1:%d\" % port, \"--duration\", \"3\", \"--keys\", \"20000\", \"--clients\", \"2\", \"--value-size\", \"1024\", \"--json\"], capture_output=True, text=True)\n    if not r.stdout.strip():\n        sys.exit(\"loadgen: \" + (r.stderr.strip().splitlines() or [\"no output\"])[-1])\n    print(\"corrupt\", json.loads(r.stdout)[\"corrupt\"])\nfinally:\n    m.kill()\n    m.wait()' {splitos}",
    ),
];
