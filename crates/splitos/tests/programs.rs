//! Unmodified programs run with their heap on mComponents give exactly their native output.
//! Each run also proves that its memory went through the components: an ExCache smaller than
//! the program makes it miss, evict and flush; the mComponents' own counters show the fetches
//! and flushes; and the pComponent served exactly the expected number of program images (an
//! image that ran natively, without the shim, would give the same output but not be counted).
mod common;
use common::*;

#[test]
fn c_program_far_larger_than_the_excache() {
    let p = program("memtouch");
    let (_, s) = through_components(&["--excache", "4M"], &[p.to_str().unwrap(), "24"], 1);
    for k in ["misses", "evictions", "flushes", "piggybacked", "plocal_fills", "bytes_fetched", "bytes_flushed", "miss_ns_p50", "miss_ns_p99"] {
        assert!(s.get(k).is_some(), "--stats-json lacks {k}: {s}");
    }
    assert!(n(&s, "evictions") > 5000, "a 24 MiB working set in a 4 MiB ExCache must evict: {s}");
    assert!(n(&s, "bytes_fetched") > 0 && n(&s, "bytes_flushed") > 0, "{s}");
    assert!(n(&s, "plocal_fills") > 1000, "first touches of fresh memory are p-local lines: {s}");
    assert!(n(&s, "miss_ns_p99") >= n(&s, "miss_ns_p50"));
}

#[test]
fn threads_fault_at_once() {
    let p = program("threads");
    through_components(&["--excache", "4M", "--fault-workers", "3"], &[p.to_str().unwrap(), "24"], 1);
}

#[test]
fn fork_gives_the_child_a_private_copy() {
    let p = program("forktest");
    // The parent and its forked child: two images, each with its own copy on the mComponents.
    let (out, _) = through_components(&["--excache", "4M"], &[p.to_str().unwrap(), "12"], 2);
    let s = text(&out.stdout);
    assert!(s.contains("child sum=same changed=yes") && s.contains("parent first half intact"), "{s}");
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
    let (out, _) = through_components(&["--excache", "4M"], &[p.to_str().unwrap(), f.path().to_str().unwrap(), "16"], 1);
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
    assert!(std::process::Command::new("javac").arg("-d").arg(dir.path()).arg(&src).status().unwrap().success());
    through_components(&["--excache", "16M"], &["java", "-Xmx256m", "-cp", dir.path().to_str().unwrap(), "Sorter"], 1);
}

#[test]
fn shell_pipelines_fork_and_exec() {
    let script = format!(
        "a=$(seq 1 3000 | sort -r | head -3 | tr '\\n' ' '); echo \"$a\"; for i in 1 2 3; do echo $((i * i)); done; exec {} -c 'print(sum(range(10**6)))'",
        python3()
    );
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
