//! `splitos run`'s side of a pComponent's program socket (the launcher of splitos_shim_abi):
//! the vNode's mount before the program starts, the pComponent's liveness while it runs, the
//! run's counters after. It speaks as the user who runs it: the pComponent decides what that
//! user may do from the socket's peer credentials.
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::config::{InterleaveRatio, Size};
use splitos_shim_abi::{
    FromZeros, Hello, IntoBytes, Op, ShimReq, ShimResp, Welcome, HELLO_LAUNCHER, SHIM_ABI_VERSION, WELCOME_MARK,
};

pub struct Launcher {
    sock: UnixStream,
    path: PathBuf,
}

fn uid() -> u32 {
    // SAFETY: getuid takes nothing and cannot fail.
    unsafe { libc::getuid() }
}

impl Launcher {
    /// Connects to the program socket at `path` for run `run_id` and asks for `vnode`'s mount
    /// point (`None`: the cluster has no file system for it). The pComponent forgets the run's
    /// counters when this connection ends.
    /// `interleave`: the run's own interleaving (a ratio and its unit), instead of the
    /// pComponent's.
    pub fn connect(
        path: &Path,
        vnode: &str,
        create_vnode: bool,
        run_id: u64,
        interleave: Option<(InterleaveRatio, Size)>,
    ) -> anyhow::Result<(Launcher, Option<PathBuf>)> {
        let sock = UnixStream::connect(path)
            .map_err(|e| anyhow::anyhow!("cannot reach the pComponent's program socket {}: {e}", path.display()))?;
        // Before anything is said: a pComponent is root's (the host's cluster) or this user's.
        let peer = crate::trusted::peer_uid(&sock)
            .map_err(|e| anyhow::anyhow!("cannot tell who serves the program socket {}: {e}", path.display()))?;
        if !crate::trusted::trusted_server(peer) {
            anyhow::bail!("the program socket {} is served by uid {peer}, neither root nor this user: it is not a pComponent of this host's cluster, refusing to run there", path.display());
        }
        let mut l = Launcher {
            sock,
            path: path.to_path_buf(),
        };
        let mut w = Welcome::new_zeroed();
        // The descriptors a welcome brings are for programs: dropped (closed) here.
        splitos_rpc::fdpass::recv_fds(&l.sock, w.as_mut_bytes()).map_err(|e| l.lost(&format!("no welcome ({e})")))?;
        if w.mark != WELCOME_MARK || w.abi != SHIM_ABI_VERSION {
            anyhow::bail!(
                "the pComponent at {} speaks another shim ABI version (a different splitos build)",
                path.display()
            );
        }
        if w.refused == libc::EAGAIN as u32 {
            anyhow::bail!(
                "the pComponent at {} is busy: too many of this user's processes are starting at once",
                path.display()
            );
        }
        if w.refused != 0 {
            anyhow::bail!(
                "the pComponent at {} grants no vNode to this user (uid {}): ask the cluster's admin for one",
                path.display(),
                uid()
            );
        }
        let mut hello = Hello::new_zeroed();
        hello.abi = SHIM_ABI_VERSION;
        hello.kind = HELLO_LAUNCHER;
        hello.run_id = run_id;
        if create_vnode {
            hello.flags |= splitos_shim_abi::HELLO_CREATE_VNODE;
        }
        if vnode.len() >= hello.vnode.len() {
            anyhow::bail!("vNode name {vnode:?} is longer than {} bytes", hello.vnode.len() - 1);
        }
        hello.vnode[..vnode.len()].copy_from_slice(vnode.as_bytes());
        if let Some((ratio, unit)) = interleave {
            // 0 of 1: none (a ratio is never that).
            (hello.interleave_local, hello.interleave_of) = ratio.0.unwrap_or((0, 1));
            hello.interleave_unit = unit.0;
        }
        l.sock.write_all(hello.as_bytes()).map_err(|e| l.lost(&e.to_string()))?;
        let dir = match l.answer() {
            Ok(bytes) if bytes.is_empty() => None,
            Ok(bytes) => Some(PathBuf::from(String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("the pComponent at {} named a mount point that is not UTF-8", path.display()))?)),
            Err(Some(e)) if e == libc::ENOENT => anyhow::bail!("the cluster of the pComponent at {} has no vNode {vnode:?} (a typo?): its vNodes are `{}` and those of its configuration or made through its API; as root, --create-vnode runs on a new one", path.display(), splitos_shim_abi::DEFAULT_VNODE),
            Err(Some(e)) if e == libc::EACCES => anyhow::bail!("vNode {vnode:?} is not granted to this user (uid {}) on the pComponent at {}", uid(), path.display()),
            Err(Some(e)) if e == libc::EAGAIN => anyhow::bail!("too many of this user's runs are under way on the pComponent at {}", path.display()),
            Err(Some(e)) if e == libc::EINVAL => anyhow::bail!(
                "the pComponent at {} refused this run's --interleave: its ExCache has too few ways per set to pin a line (each set keeps two ways, and its evict_reserve, for the pages that come and go; docs/elastic-memory.md#interleaving)",
                path.display()
            ),
            Err(Some(e)) if e == libc::EBUSY => anyhow::bail!("the pComponent at {} is cordoned: it takes no new programs (`splitos cluster uncordon`)", path.display()),
            Err(Some(e)) => anyhow::bail!("the pComponent at {} cannot mount vNode {vnode:?}: {}", path.display(), std::io::Error::from_raw_os_error(e)),
            Err(None) => return Err(l.lost("it closed the connection")),
        };
        Ok((l, dir))
    }

    fn lost(&self, how: &str) -> anyhow::Error {
        anyhow::anyhow!("the pComponent at {} stopped answering: {how}", self.path.display())
    }

    /// A reply and the bytes it announces; `Err(Some(errno))` for a refusal, `Err(None)` when
    /// the connection broke.
    fn answer(&mut self) -> Result<Vec<u8>, Option<i32>> {
        let mut r = ShimResp::default();
        self.sock.read_exact(r.as_mut_bytes()).map_err(|_| None)?;
        if r.ret < 0 {
            return Err(Some(-r.ret as i32));
        }
        // Mount points and counters are small; a length beyond this is not an answer.
        if r.val > 16 << 20 {
            return Err(None);
        }
        let mut bytes = vec![0; r.val as usize];
        self.sock.read_exact(&mut bytes).map_err(|_| None)?;
        Ok(bytes)
    }

    /// The counters of run `run_id` (JSON), if the pComponent has them.
    pub fn run_stats(&mut self, run_id: u64) -> Option<serde_json::Value> {
        let req = ShimReq {
            op: Op::RunStats as u32,
            a: run_id,
            ..Default::default()
        };
        self.sock.write_all(req.as_bytes()).ok()?;
        serde_json::from_slice(&self.answer().ok()?).ok()
    }

    /// Waits until the pComponent goes away (its end of the connection closes: it never
    /// speaks unasked) or `stop` has something to read. True if the pComponent went away.
    pub fn wait_lost(&self, stop: &UnixStream) -> bool {
        let mut fds = [
            libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: poll reads and writes the two pollfds of the array, which outlives the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return fds[1].revents == 0 && fds[0].revents != 0;
        }
    }
}
