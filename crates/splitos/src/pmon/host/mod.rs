//! Process hosting: the program socket and the shim protocol ([`shim`]), the fault workers
//! that read each program's userfaultfd ([`fault`], [`fault_cpu`]), the operations on a
//! program's heap region ([`uffd`], [`huge`]), idle polling while programs run ([`idle`]), and the heap ranges kept mapped at a process's
//! home ([`reuse`]).
pub(super) mod fault;
pub(super) mod fault_cpu;
pub(super) mod huge;
pub(crate) mod idle;
pub(super) mod reuse;
pub(super) mod shim;
pub(super) mod uffd;
