//! Unmodified programs run with their heap on mComponents give exactly their native output.
//! Each run also proves that its memory went through the components: an ExCache smaller than
//! the program makes it miss, evict and flush; the mComponents' own counters show the fetches
//! and flushes; and the pComponent served exactly the expected number of program images (an
//! image that ran natively, without the shim, would give the same output but not be counted).
use crate::common;
use common::*;

#[test]
fn c_program_far_larger_than_the_excache() {
    let p = program("memtouch");
    let (_, s) = through_components(&["--excache", "4M"], &[p.to_str().unwrap(), "24"], 1);
    for k in [
        "misses",
        "evictions",
        "flushes",
        "piggybacked",
        "plocal_fills",
        "bytes_fetched",
        "bytes_flushed",
        "miss_ns_p50",
        "miss_ns_p99",
    ] {
        assert!(s.get(k).is_some(), "--stats-json lacks {k}: {s}");
    }
    assert!(
        n(&s, "evictions") > 5000,
        "a 24 MiB working set in a 4 MiB ExCache must evict: {s}"
    );
    assert!(n(&s, "bytes_fetched") > 0 && n(&s, "bytes_flushed") > 0, "{s}");
    // Every page of the 24 MiB is first touched fresh: filled in the pComponent, by a trap
    // or with one's window.
    assert!(
        n(&s, "plocal_fills") > 100
            && n(&s, "plocal_fills") + n(&s, "faulted_around") + n(&s, "preallocated") >= 24 * 256,
        "first touches of fresh memory are p-local lines: {s}"
    );
    assert!(n(&s, "miss_ns_p99") >= n(&s, "miss_ns_p50"));
}

#[test]
fn threads_fault_at_once() {
    let p = program("threads");
    through_components(
        &["--excache", "4M", "--fault-workers", "3"],
        &[p.to_str().unwrap(), "24"],
        1,
    );
}

#[test]
fn fork_gives_the_child_a_private_copy() {
    let p = program("forktest");
    // The parent and its forked child: two images, each with its own copy on the mComponents.
    let (out, _) = through_components(&["--excache", "4M"], &[p.to_str().unwrap(), "12"], 2);
    let s = text(&out.stdout);
    assert!(
        s.contains("child sum=same changed=yes") && s.contains("parent first half intact"),
        "{s}"
    );
}

#[test]
fn new_memory_reads_zero_and_realloc_mremap_brk_keep_contents() {
    let p = program("zero");
    let (out, _) = through_components(&["--excache", "4M"], &[p.to_str().unwrap()], 1);
    let s = text(&out.stdout);
    assert!(!s.contains(": 0"), "every check must hold:\n{s}");
}

#[test]
fn kernel_reads_and_writes_non_resident_heap_pages() {
    let p = program("kernelio");
    let f = tempfile::NamedTempFile::new().unwrap();
    let (out, _) = through_components(
        &["--excache", "4M"],
        &[p.to_str().unwrap(), f.path().to_str().unwrap(), "16"],
        1,
    );
    assert!(text(&out.stdout).contains("equal=1"));
}

#[test]
fn cxx_containers() {
    let p = program("cxx_containers");
    through_components(&["--excache", "4M"], &[p.to_str().unwrap()], 1);
}

#[test]
fn python() {
    let script = "import hashlib, json\nd = {i: str(i) * 10 for i in range(150000)}\ns = sorted(d.values(), key=lambda x: hashlib.md5(x.encode()).hexdigest())\nprint(len(s), s[0], s[-1], sum(len(x) for x in s))\nprint(json.dumps({'k': [1, 2, 3]}))\n";
    through_components(&["--excache", "8M"], &[&python3(), "-c", script], 1);
}

#[test]
fn nodejs() {
    let script = "let a=[]; for (let i=0;i<200000;i++) a.push({i, s:'x'+i}); a.sort((x,y)=>y.i-x.i); console.log(a.length, a[0].s, a[a.length-1].s, JSON.stringify(a.slice(0,2)));";
    through_components(&["--excache", "8M"], &["node", "-e", script], 1);
}

#[test]
fn java() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("Sorter.java");
    std::fs::write(
        &src,
        "import java.util.*;\npublic class Sorter { public static void main(String[] a) { List<String> l = new ArrayList<>(); for (int i = 0; i < 200000; i++) l.add(\"s\" + (i * 7919 % 200000)); Collections.sort(l); Map<Integer,Integer> m = new HashMap<>(); for (String s : l) m.merge(s.length(), 1, Integer::sum); System.out.println(l.size() + \" \" + l.get(0) + \" \" + l.get(l.size() - 1) + \" \" + new TreeMap<>(m)); } }\n",
    )
    .unwrap();
    assert!(std::process::Command::new("javac")
        .arg("-d")
        .arg(dir.path())
        .arg(&src)
        .status()
        .unwrap()
        .success());
    through_components(
        &["--excache", "16M"],
        &["java", "-Xmx256m", "-cp", dir.path().to_str().unwrap(), "Sorter"],
        1,
    );
}

#[test]
fn shell_pipelines_fork_and_exec() {
    let script = format!("a=$(seq 1 3000 | sort -r | head -3 | tr '\\n' ' '); echo \"$a\"; for i in 1 2 3; do echo $((i * i)); done; exec {} -c 'print(sum(range(10**6)))'", python3());
    // bash; the subshell it forks for $(...); in it, a forked child per pipeline stage, each of
    // which execs its program; the last exec of bash into python: 1 + 1 + 4 + 4 + 1 images.
    through_components(&["--excache", "4M"], &["bash", "-c", &script], 11);
}

#[test]
fn static_programs_are_refused_or_run_natively_with_a_warning() {
    let p = program("static_hello");
    let out = under_splitos(&[], &[p.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("statically linked"), "{}", text(&out.stderr));
    let out = under_splitos(&["--allow-native"], &[p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "hello from a static binary\n");
    assert!(text(&out.stderr).contains("NATIVELY"));
}

#[test]
fn exit_status_and_signals_are_the_programs() {
    same_as_native(&[], &["bash", "-c", "echo out; echo err >&2; exit 7"]);
    let out = under_splitos(&[], &["bash", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15));
}

#[test]
fn a_program_linked_with_jemalloc_forks_and_its_child_finds_both_heaps() {
    let p = program("jemalloc_fork");
    // jemalloc's fork handlers reset its locks in its arenas, on the heap region, before fork()
    // returns in the child: the child's heap must be there by then. Two images: the parent and
    // the child, which reads both heaps back from its copy on the mComponents.
    let (out, _) = through_components(&["--excache", "4M"], &[p.to_str().unwrap(), "12"], 2);
    let s = text(&out.stdout);
    assert!(
        s.contains("child: heaps as the parent left them, jemalloc's new block zeroed and written\nchild exited 0\n")
            && s.contains("intact"),
        "{s}"
    );
}

/// A redis-server (Debian's, linked with jemalloc) started by `launch` (with `env`) with its
/// Unix socket, pid file, log and RDB in `dir`; killed by its PID if the test ends while it
/// runs.
struct Redis {
    dir: std::path::PathBuf,
    launched: std::process::Child,
}

impl Redis {
    fn start(dir: &std::path::Path, launch: &[&str], env: &[(&str, std::path::PathBuf)], daemonize: bool) -> Redis {
        let at = |f: &str| dir.join(f).to_str().unwrap().to_string();
        let (sock, pidfile, log) = (at("redis.sock"), at("redis.pid"), at("redis.log"));
        let mut cmd: Vec<&str> = launch.to_vec();
        cmd.extend([
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            &sock,
            "--pidfile",
            &pidfile,
            "--dir",
            dir.to_str().unwrap(),
            "--logfile",
            &log,
        ]);
        cmd.extend([
            "--save",
            "",
            "--appendonly",
            "no",
            "--enable-debug-command",
            "local",
            "--daemonize",
            if daemonize { "yes" } else { "no" },
        ]);
        let launched = std::process::Command::new(cmd[0])
            .args(&cmd[1..])
            .env_remove("SPLITOS_GM")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let r = Redis {
            dir: dir.to_path_buf(),
            launched,
        };
        let t0 = std::time::Instant::now();
        while r.cli(&["ping"]) != "PONG" {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "redis-server never answered: {}",
                r.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        r
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .arg("-s")
            .arg(self.dir.join("redis.sock"))
            .args(args)
            .output()
            .unwrap();
        text(&out.stdout).trim().to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("redis.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// SHUTDOWN NOSAVE; returns once the server has ended (it removes its pid file last).
    fn shut_down(&self) {
        self.cli(&["shutdown", "nosave"]);
        let t0 = std::time::Instant::now();
        while self.pid().is_some() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "redis-server did not end: {}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) takes no pointers; the PID is this test's redis-server's.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.launched.wait();
    }
}

/// Writes data to a redis-server started by `launch`, has it BGSAVE (a forked child writes the
/// RDB from its copy of the heap), shuts it down without saving, then checks the RDB with
/// redis-check-rdb and loads it into a native redis-server. Returns what was seen, for
/// comparison with a native run, and the server's log.
fn redis_bgsave_report(launch: &[&str], env: &[(&str, std::path::PathBuf)], daemonize: bool) -> (String, String) {
    let dir = tempfile::Builder::new().prefix("splitos-redis-").tempdir().unwrap();
    let r = Redis::start(dir.path(), launch, env, daemonize);
    let mut report = vec![
        r.cli(&["debug", "populate", "30000", "key", "200"]),
        r.cli(&["rpush", "list", "a", "b", "c"]),
        r.cli(&["hset", "hash", "disaggregated", "yes", "monitors", "4"]),
    ];
    let digest = r.cli(&["debug", "digest"]);
    report.push(r.cli(&["bgsave"]));
    let t0 = std::time::Instant::now();
    while !r.cli(&["info", "persistence"]).contains("rdb_bgsave_in_progress:0") {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "BGSAVE never ended: {}",
            r.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let info = r.cli(&["info", "persistence"]);
    report.extend(
        info.lines()
            .filter(|l| l.starts_with("rdb_last_bgsave_status") || l.starts_with("rdb_changes_since_last_save"))
            .map(str::to_string),
    );
    r.shut_down();
    let log = r.log();
    drop(r);
    let check = std::process::Command::new("redis-check-rdb")
        .arg(dir.path().join("dump.rdb"))
        .output()
        .unwrap();
    report.push(format!("redis-check-rdb exit {:?}", check.status.code()));
    // (Not the offsets it names: the RDB records the server's memory use, which differs.)
    report.extend(
        text(&check.stdout)
            .lines()
            .filter_map(|l| {
                l.split_once("] ")
                    .filter(|(_, m)| m.contains("keys read") || m.contains("RDB looks OK"))
            })
            .map(|(_, m)| m.to_string()),
    );
    // The RDB loaded by a native server holds exactly the data the saving server had.
    let loaded = Redis::start(dir.path(), &[], &[], false);
    let same = loaded.cli(&["debug", "digest"]) == digest;
    report.push(format!(
        "loaded: dbsize {}, digest {}",
        loaded.cli(&["dbsize"]),
        if same { "as saved" } else { "DIFFERENT" }
    ));
    report.push(loaded.cli(&["lrange", "list", "0", "-1"]).replace('\n', " "));
    report.push(loaded.cli(&["hget", "hash", "monitors"]));
    loaded.shut_down();
    (report.join("\n"), log)
}

#[test]
fn redis_server_linked_with_jemalloc_saves_with_bgsave_in_a_forked_child() {
    let (native, log) = redis_bgsave_report(&[], &[], false);
    assert!(
        native.contains("rdb_last_bgsave_status:ok") && native.contains("loaded: dbsize 30002, digest as saved"),
        "{native}\n{log}"
    );
    let stats = tempfile::NamedTempFile::new().unwrap();
    let data = tempfile::Builder::new().prefix("splitos-test-data-").tempdir().unwrap();
    let env = [
        (
            "SPLITOS_STATE_DIR",
            std::env::temp_dir().join("splitos-test-no-cluster"),
        ),
        ("SPLITOS_DATA_DIR", data.path().to_path_buf()),
    ];
    let splitos = splitos();
    let launch = [
        splitos.to_str().unwrap(),
        "run",
        "--embedded",
        "--excache",
        "4M",
        "--stats-json",
        stats.path().to_str().unwrap(),
        "--",
    ];
    let (under, log) = redis_bgsave_report(&launch, &env, false);
    assert_eq!(under, native, "redis-server's log under splitos:\n{log}");
    // The server and its BGSAVE child, each served by the pComponent; the child wrote the RDB
    // from its copy of the heap, fetched through the ExCache from the mComponents.
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(stats.path()).unwrap()).unwrap();
    assert_through_components(&s, 2);
}

#[test]
fn redis_server_daemonizes_under_splitos_and_its_daemon_saves_with_bgsave() {
    let (native, log) = redis_bgsave_report(&[], &[], true);
    assert!(
        native.contains("rdb_last_bgsave_status:ok") && native.contains("loaded: dbsize 30002, digest as saved"),
        "{native}\n{log}"
    );
    // A cluster that outlives the launching image, which forks the daemon and exits.
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let env = [
        ("SPLITOS_STATE_DIR", c.dir.path().to_path_buf()),
        ("SPLITOS_DATA_DIR", c.dir.path().join("data")),
    ];
    let splitos = splitos();
    let (under, log) = redis_bgsave_report(&[splitos.to_str().unwrap(), "run", "--"], &env, true);
    assert_eq!(under, native, "redis-server's log under splitos:\n{log}");
    // The launching image, the daemon it forked and the daemon's BGSAVE child.
    let p = c.components("pcomponent").remove(0);
    assert_eq!(p["stats"]["totals"]["processes"], 3, "{}", p["stats"]["totals"]);
}

#[test]
fn a_library_that_registers_fork_handlers_before_the_shim_starts_finds_the_childs_heap() {
    // The library's constructor runs before the preloaded shim's and registers its handlers
    // before anything uses the heap; its child handler writes to heap memory allocated later.
    let dir = tempfile::tempdir().unwrap();
    let (lib, prog) = (
        dir.path().join("libatfork_early_lib.so"),
        dir.path().join("atfork_early"),
    );
    let cc = |args: &[&std::ffi::OsStr]| {
        assert!(
            std::process::Command::new("gcc")
                .arg("-O2")
                .args(args)
                .status()
                .unwrap()
                .success(),
            "gcc {args:?}"
        )
    };
    cc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-o".as_ref(),
        lib.as_os_str(),
        programs_src().join("atfork_early_lib.c").as_os_str(),
    ]);
    let rpath = format!("-Wl,-rpath,{}", dir.path().display());
    let libdir = format!("-L{}", dir.path().display());
    cc(&[
        "-o".as_ref(),
        prog.as_os_str(),
        programs_src().join("atfork_early.c").as_os_str(),
        libdir.as_ref(),
        "-latfork_early_lib".as_ref(),
        rpath.as_ref(),
    ]);
    let (out, s) = same_as_native_with_stats(&[], &[prog.to_str().unwrap()]);
    assert_eq!(
        text(&out.stdout),
        "child: rewritten by the library's child handler\nchild exited 0\nparent: written in the parent\n"
    );
    // The parent and the child, whose heap the pComponent set up before the library's handler ran.
    assert_eq!(n(&s, "processes"), 2, "{s}");
}
