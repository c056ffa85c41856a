//! gmig-vmm: a small KVM VMM built from rust-vmm crates (`kvm-ioctls`, `vm-memory`,
//! `vmm-sys-util`, `vm-superio`) that runs a real guest GPU driver on a gmig vGPU and
//! live-migrates the whole VM between two VMM processes — the worked example of linking gmig into
//! a rust-vmm VMM (`docs/integration.md` walks through it).
//!
//! * [`kvm`]: memfd-backed guest RAM with KVM dirty logging, one 64-bit vCPU, the exit loop, the
//!   vCPU's migratable state.
//! * [`guest`]: the guest program (freestanding C in `guest/`, built from source at build time)
//!   and its boot parameters.
//! * [`gpu`]: the vGPU attached in process ([`gpu::Linked`]) or over vfio-user ([`gpu::Remote`]).
//! * [`machine`]: the VM with its buses.
//! * [`migrate`]: whole-VM live migration over a byte stream (TCP): RAM pre-copy with KVM's dirty
//!   log joined with the vGPU's DMA-logged pages, vCPU and device state, commit on the
//!   destination's acknowledgement.
//! * [`switchover`]: what the guest and the vGPU had done at the switch-over and what the
//!   destination did after it.
//!
//! **Interrupts.** The VMM has no interrupt controller: the guest waits for its seqno by polling
//! a vGPU register (each poll is an exit, during which the vGPU makes progress). MSIs the vGPU
//! raises are signalled on an eventfd and counted, not delivered.

pub mod gpu;
pub mod guest;
pub mod kvm;
pub mod loopback;
pub mod machine;
pub mod migrate;
pub mod pci;
pub mod switchover;

pub use gpu::{GpuLink, GpuPci, Linked, Remote};
pub use guest::{GuestConfig, GuestProfile, Telemetry};
pub use kvm::{memfd_guest_ram, Bus, DirtyLogMode, DirtyLogWant, Stop, VcpuState, Vm, VmOptions};
pub use machine::Machine;
pub use pci::{PciDevice, PciHost};
pub use switchover::{GpuProgress, Progress, Work};

/// Errors of the VMM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A KVM ioctl failed.
    #[error("KVM {what}: {source}")]
    Kvm {
        /// Which call.
        what: &'static str,
        /// The errno.
        source: kvm_ioctls::Error,
    },
    /// Guest RAM could not be made or accessed.
    #[error("guest RAM: {0}")]
    Ram(String),
    /// The guest did something the VMM does not handle.
    #[error("guest: {0}")]
    Guest(String),
    /// The vGPU refused or failed an access or a migration step.
    #[error("vGPU: {0}")]
    Device(String),
    /// The migration connection failed.
    #[error("migration connection: {0}")]
    Io(#[from] std::io::Error),
    /// The migration stream is malformed, or the peer refused it.
    #[error("migration stream: {0}")]
    Stream(String),
    /// The switch-over broke where this side cannot tell whether the other side runs the VM:
    /// the source after it started sending COMMIT without hearing RESUMED, the destination after
    /// it restored the VM without hearing COMMIT or ABORT. This side holds a complete, stopped
    /// copy and must not run it unless the other side is known not to (docs/reliability.md).
    #[error("in doubt: {0}")]
    InDoubt(String),
}

impl Error {
    /// Whether this side is in doubt (see [`Error::InDoubt`]).
    pub fn in_doubt(&self) -> bool {
        matches!(self, Error::InDoubt(_))
    }
}

/// Results of the VMM.
pub type Result<T> = std::result::Result<T, Error>;

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { what, source }
}
