//! A new process's home: asked of the managers and made at the mComponent they name, with
//! the waits that let a program start while a manager restarts.
use super::*;

/// How long a program's start waits for the global managers, or a home, when none can be
/// reached: a manager started again is back within seconds, and a dead home is held lost
/// after the managers' silence limit.
const MANAGERS_BACK: std::time::Duration = std::time::Duration::from_secs(30);

impl Pcomp {
    /// A new process's home, picked by the managers and made there. While no manager can be
    /// reached (the only one restarting), none knows a live mComponent yet (one just started
    /// again), or the home picked cannot be reached (dead, not yet held lost), the program's
    /// start waits and asks again, for at most [`MANAGERS_BACK`], rather than failing with
    /// nothing to say why. A request that may have arrived (its answer lost) is not sent again.
    pub(super) fn make_home(
        &self,
        who: &Who,
        region_base: u64,
        region_size: u64,
    ) -> Result<(G2P_HOME, <P2M_PROC_CREATE as Request>::Reply), splitos_rpc::RpcError> {
        use splitos_rpc::RpcError;
        let t0 = std::time::Instant::now();
        loop {
            // A pick may be asked again whatever became of the last (it takes nothing, and a
            // manager killed during the call answers no more); the process is made at most
            // once, so only a creation surely not delivered is sent again.
            let picked = self.node.call_gm(P2G_PICK_HOME {
                vnode: who.vnode.clone(),
                pcomp: self.node.id(),
            });
            let (r, again) = match picked {
                // Not delivered, closed, late, or answered "no mComponent alive".
                Err(e) => {
                    let again = e.code() == ErrCode::Unreachable;
                    (Err(e), again)
                }
                Ok(home) => {
                    let created = self.node.rpc.call(
                        &home.mcomp.addr,
                        P2M_PROC_CREATE {
                            who: who.clone(),
                            region_base,
                            region_size,
                            pcomp: self.node.id(),
                            memory_quota: home.memory_quota,
                        },
                    );
                    let again = matches!(created, Err(RpcError::Unreachable { .. }));
                    (created.map(|c| (home, c)), again)
                }
            };
            if !again || t0.elapsed() >= MANAGERS_BACK {
                if let (true, Err(e)) = (again, &r) {
                    tracing::warn!(vnode = %who.vnode, error = %e, waited_s = MANAGERS_BACK.as_secs(), "no home for a new process: the program is refused");
                }
                return r;
            }
            crate::series::STARTS_WAITED_FOR_MANAGERS.increment(1);
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}
