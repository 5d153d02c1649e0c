//! Process hosting: the program socket and the shim protocol ([`shim`]), the fault workers
//! that read each program's userfaultfd ([`fault`], [`fault_cpu`]), the operations on a
//! program's heap region (`uffd`, `huge`, in `splitos-excache`), idle polling while programs run ([`idle`]), and the heap ranges kept mapped at a process's
//! home ([`reuse`]).
pub(super) use splitos_excache::{huge, uffd};

pub(super) mod fault;
pub(super) mod fault_cpu;
pub mod idle;
pub(super) mod reuse;
pub(super) mod shim;
