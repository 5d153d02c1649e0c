//! `splitos top`: the cluster live in a terminal, through the REST API: its components (load,
//! memory, cordons) and its jobs with their ExCache misses, evictions and write-backs per
//! second, from the change of their counters between two looks.
use std::collections::HashMap;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use comfy_table::Table;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::termios::{self, LocalFlags, SetArg, Termios};

use super::{api_access, api_get, human, ApiArgs};

/// A job's counters at one look.
#[derive(Clone, Copy)]
struct Counts {
    misses: u64,
    evictions: u64,
    writebacks: u64,
}

fn counts(j: &serde_json::Value) -> Counts {
    let n = |k: &str| j[k].as_u64().unwrap_or(0);
    Counts {
        misses: n("misses"),
        evictions: n("evictions"),
        writebacks: n("writebacks"),
    }
}

/// The keys typed while top runs, read one at a time without echo (as top reads them); the
/// terminal is given back as it was when this is dropped.
struct Keys(Option<Termios>);

impl Keys {
    fn take() -> Keys {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Keys(None);
        }
        let Ok(was) = termios::tcgetattr(&stdin) else {
            return Keys(None);
        };
        let mut keys = was.clone();
        // ^C is read as a key too, so that it quits through here and the terminal is given back.
        keys.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG);
        if termios::tcsetattr(&stdin, SetArg::TCSANOW, &keys).is_err() {
            return Keys(None);
        }
        Keys(Some(was))
    }

    /// Waits `wait`, or less if a key that quits is typed (q, Q, ^C): then true.
    fn quit_within(&self, wait: Duration) -> bool {
        if self.0.is_none() {
            std::thread::sleep(wait);
            return false;
        }
        let until = Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let stdin = std::io::stdin();
            let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
            let ms = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            match poll(&mut fds, ms) {
                Ok(0) => return false,
                Ok(_) => {
                    let mut typed = [0u8; 64];
                    match nix::unistd::read(&stdin, &mut typed) {
                        // The terminal is gone: nobody is left to look.
                        Ok(0) => return true,
                        Ok(n) if quits(&typed[..n]) => return true,
                        _ => {}
                    }
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return false,
            }
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        if let Some(was) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, was);
        }
    }
}

/// Whether `typed` has a key that quits: q (or Q), as in top, or ^C.
fn quits(typed: &[u8]) -> bool {
    typed.iter().any(|b| matches!(b, b'q' | b'Q' | 0x03))
}

/// Each line of `frame` cut to `width` characters, as top cuts them: a line the terminal
/// wrapped would push the frame's top out of sight.
fn fit(frame: &str, width: usize) -> String {
    frame
        .split_inclusive('\n')
        .map(|l| {
            let (line, end) = l.strip_suffix('\n').map_or((l, ""), |x| (x, "\n"));
            match line.char_indices().nth(width) {
                Some((at, _)) => format!("{}{end}", &line[..at]),
                None => l.to_string(),
            }
        })
        .collect()
}

/// Shows the cluster every `interval`, `frames` times (forever: none). On a terminal each
/// frame replaces the last, cut to its width, and q quits; elsewhere frames follow one
/// another.
pub fn top(a: ApiArgs, interval: Duration, frames: Option<u64>) -> anyhow::Result<()> {
    let (api, token) = api_access(a)?;
    let tty = std::io::stdout().is_terminal();
    // Piped on (`| less`), the terminal's keys are the pager's.
    let keys = if tty { Keys::take() } else { Keys(None) };
    let mut before: HashMap<String, (Instant, Counts)> = HashMap::new();
    let mut shown = 0;
    loop {
        let at = Instant::now();
        let comps = api_get(&api, &token, "/api/v1/components");
        let jobs = api_get(&api, &token, "/api/v1/jobs")?;
        let mut out = String::new();
        if tty {
            out.push_str("\x1b[H\x1b[2J");
        }
        let quit = if keys.0.is_some() { " (q quits)" } else { "" };
        out.push_str(&format!(
            "splitos top: {api}, every {:.1} s{quit}\n",
            interval.as_secs_f64()
        ));
        // A tenant's token sees its jobs, not the components.
        if let Ok(comps) = comps {
            let mut t = Table::new();
            t.load_preset(comfy_table::presets::NOTHING);
            t.set_header([
                "ID",
                "ROLE",
                "ADDRESS",
                "STATE",
                "PROCS",
                "THREADS",
                "USED",
                "COMMITTED",
                "CAPACITY",
            ]);
            for c in comps.as_array().into_iter().flatten() {
                let state = match (c["alive"].as_bool(), c["lost"].as_bool(), c["cordoned"].as_bool()) {
                    (Some(true), _, Some(true)) => "cordoned",
                    (Some(true), _, _) => "up",
                    (_, Some(true), _) => "LOST",
                    _ => "late",
                };
                let bytes = |k: &str| human(c[k].as_u64().unwrap_or(0));
                t.add_row([
                    c["id"].to_string(),
                    c["role"].as_str().unwrap_or("?").to_string(),
                    c["addr"].as_str().unwrap_or("?").to_string(),
                    state.to_string(),
                    c["processes"].to_string(),
                    c["threads"].to_string(),
                    bytes("used_bytes"),
                    bytes("committed_bytes"),
                    bytes("capacity_bytes"),
                ]);
            }
            out.push_str(&format!("{t}\n\n"));
        }
        let mut t = Table::new();
        t.load_preset(comfy_table::presets::NOTHING);
        t.set_header([
            "PID",
            "USER",
            "VNODE",
            "PCOMP",
            "MISSES/S",
            "EVICTIONS/S",
            "WRITEBACKS/S",
            "MISSES",
            "COMMAND",
        ]);
        let mut now = HashMap::new();
        for j in jobs["jobs"].as_array().into_iter().flatten() {
            let pid = j["pid"].as_str().unwrap_or("?").to_string();
            let c = counts(j);
            // A rate needs two looks at the job: the first shows none.
            let rate = |f: fn(&Counts) -> u64| match before.get(&pid) {
                Some((t0, c0)) => format!(
                    "{:.0}",
                    f(&c).saturating_sub(f(c0)) as f64 / at.duration_since(*t0).as_secs_f64().max(1e-3)
                ),
                None => "-".to_string(),
            };
            let cmd = j["command"].as_str().unwrap_or("");
            t.add_row([
                j["os_pid"].to_string(),
                j["user"].as_str().unwrap_or("?").to_string(),
                j["vnode"].as_str().unwrap_or("?").to_string(),
                j["pcomponent"].to_string(),
                rate(|c| c.misses),
                rate(|c| c.evictions),
                rate(|c| c.writebacks),
                c.misses.to_string(),
                if cmd.chars().count() > 50 {
                    format!("{}...", cmd.chars().take(47).collect::<String>())
                } else {
                    cmd.to_string()
                },
            ]);
            now.insert(pid, (at, c));
        }
        out.push_str(&format!("{} job(s)\n{t}\n", now.len()));
        match Table::new().width().filter(|_| tty) {
            Some(width) => out = fit(&out, width.into()),
            None => out.push('\n'),
        }
        crate::out!("{out}");
        before = now;
        shown += 1;
        if frames.is_some_and(|n| shown >= n) || keys.quit_within(interval.saturating_sub(at.elapsed())) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q_and_ctrl_c_quit_other_keys_do_not() {
        assert!(quits(b"q") && quits(b"xQ") && quits(&[0x03]));
        assert!(!quits(b" ") && !quits(b"h") && !quits(b""));
    }

    #[test]
    fn a_frame_is_cut_to_the_terminals_width() {
        assert_eq!(fit("abcdef\nab\nµµµµµ\n", 4), "abcd\nab\nµµµµ\n");
        assert_eq!(fit("abc", 2), "ab");
    }
}
