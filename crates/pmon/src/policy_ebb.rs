//! The `excache-policies` Ebb of a pComponent (docs/ebb.md#policies-as-ebbs): its representative
//! takes a [`SetPolicy`] from the global managers or the admin's tools (their
//! [`SetPolicy::ask`]) and replaces the ExCache's policies through [`Pcomp::set_policy`].
//!
//! It is the pComponent's, not the ExCache's, because it answers for a whole pComponent (who
//! may ask, whether it is stopping); the ExCache (excache/policies.rs) only knows how to
//! replace a policy.
use std::sync::Weak;

use bytes::Bytes;
use splitos_ebb::messenger::{Messagable, Origin, Refused, Serving};
use splitos_ebb::{Ebb, EbbId};
use splitos_rpc::{Role, SetPolicy, EBB_EXCACHE_POLICIES};

use super::Pcomp;

/// The representative of the `excache-policies` Ebb on a pComponent.
struct PolicyMessages {
    pcomp: Weak<Pcomp>,
}

impl Messagable for PolicyMessages {
    fn receive(&self, from: &Origin, body: Bytes) -> Result<Bytes, Refused> {
        // The transport without credentials is built by benchmarks and tests alone.
        if from
            .role
            .as_deref()
            .is_some_and(|r| r != Role::Gm.name() && r != Role::Admin.name())
        {
            return Err(Refused::Denied(format!(
                "a {} may not replace a pComponent's policies",
                from.role.as_deref().unwrap_or("?")
            )));
        }
        let r: SetPolicy =
            postcard::from_bytes(&body).map_err(|e| Refused::Invalid(format!("not a SetPolicy message: {e}")))?;
        let pcomp = self
            .pcomp
            .upgrade()
            .ok_or_else(|| Refused::Invalid("the pComponent is stopping".into()))?;
        let now = pcomp.set_policy(r).map_err(|e| Refused::Invalid(e.to_string()))?;
        Ok(postcard::to_allocvec(&now).expect("a PolicyState encodes").into())
    }
}

/// Serves the `excache-policies` Ebb of `pcomp` until the guard is dropped.
pub fn serve(pcomp: Weak<Pcomp>) -> Serving {
    let ebb = Ebb::with_id(EbbId(EBB_EXCACHE_POLICIES), "excache-policies", move |_| {
        PolicyMessages { pcomp: pcomp.clone() }
    })
    .expect("one pComponent per process");
    splitos_ebb::messenger::serve(&ebb).expect("a static id served once")
}
