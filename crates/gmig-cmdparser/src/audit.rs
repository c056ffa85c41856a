//! The audit: what a mediated parser must check before a guest's commands reach the GPU.
//!
//! A command passes when
//! - it is not one of the refused commands (MI_UPDATE_GTT, MI_CLFLUSH, MI_REPORT_PERF_COUNT,
//!   MI_COPY_MEM_MEM (GVT-g's "MI_OP_2E"), and MI_SET_CONTEXT / MI_DISPLAY_FLIP, which a vGPU
//!   does not expose). MI_STORE_DATA_INDEX, MI_CONDITIONAL_BATCH_BUFFER_END and
//!   MI_SEMAPHORE_WAIT are admitted as GVT-g's scanner admits them, their addresses checked like
//!   any other (the index of a store-data-index write against its status page);
//! - its address layout is modelled, or it runs in an unprivileged (PPGTT) batch where it cannot
//!   reach the GGTT;
//! - every GGTT range it uses lies wholly inside the vGPU's aperture slice or wholly inside its
//!   hidden slice, and is at most 36 MiB long; an unprivileged batch selects no GGTT address
//!   at all (the selector bits are privileged, as in i915's parser);
//! - the registers it loads or stores are on the [whitelist](crate::regs);
//! - batch nesting is legal (no MI_BATCH_BUFFER_START in a second-level batch, no second-level
//!   call from the ring).

use thiserror::Error;

use crate::addr::{AddressSpace, VgpuSlices, GTT_PAGE_SIZE, MAX_SURFACE_BYTES};
use crate::decode::{BatchContext, BatchLevel, Decoded};
use crate::regs::{register_allowed, RegAccess};
use crate::table::{Flags, Hook};

/// Why a command failed the audit. Every variant names the command's dword offset.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum AuditError {
    /// A command a mediated parser must refuse.
    #[error("dword {offset}: {name} is forbidden")]
    Forbidden {
        /// Dword offset of the command.
        offset: usize,
        /// The command.
        name: &'static str,
    },
    /// A command whose address fields are not modelled, in a privileged (GGTT) buffer.
    #[error("dword {offset}: {name} is not modelled and may not run from a privileged buffer")]
    Unmodelled {
        /// Dword offset of the command.
        offset: usize,
        /// The command.
        name: &'static str,
    },
    /// A GGTT range outside both slices of the vGPU.
    #[error(
        "dword {offset}: {name} {field} uses GGTT 0x{start:x}+0x{len:x} outside the vGPU's slices"
    )]
    OutOfSlice {
        /// Dword offset of the command.
        offset: usize,
        /// The command.
        name: &'static str,
        /// The address field.
        field: &'static str,
        /// First byte of the range.
        start: u64,
        /// Length of the range.
        len: u64,
    },
    /// A surface larger than the 36 MiB cap.
    #[error("dword {offset}: {name} {field} touches 0x{len:x} bytes, more than the 36 MiB cap")]
    SurfaceTooLarge {
        /// Dword offset of the command.
        offset: usize,
        /// The command.
        name: &'static str,
        /// The address field.
        field: &'static str,
        /// Length of the range.
        len: u64,
    },
    /// A surface state that a privileged buffer's work command uses names GGTT memory outside the
    /// vGPU's slices (or lies outside them itself).
    #[error(
        "dword {offset}: the surface state at GGTT 0x{state:x} that this work command uses has \
         its {field} 0x{start:x}+0x{len:x} outside the vGPU's slices"
    )]
    SurfaceStateOutOfSlice {
        /// Dword offset of the (draw, dispatch) command.
        offset: usize,
        /// GGTT address of the surface state.
        state: u64,
        /// The field (or `location` for the state itself).
        field: &'static str,
        /// First byte of the range.
        start: u64,
        /// Length of the range.
        len: u64,
    },
    /// A surface state that a privileged buffer's work command uses describes a surface whose
    /// size the state does not give (a reserved surface type), so its GGTT range cannot be checked.
    #[error(
        "dword {offset}: {name} uses the surface state at GGTT 0x{state:x}, which does not size \
         its surface"
    )]
    UnsizedSurface {
        /// Dword offset of the command.
        offset: usize,
        /// The command.
        name: &'static str,
        /// GGTT address of the surface state.
        state: u64,
    },
    /// An unprivileged (PPGTT) batch selected a GGTT address.
    #[error("dword {offset}: {name} {field} selects the GGTT from an unprivileged batch")]
    GgttFromUnprivileged {
        /// Dword offset of the command.
        offset: usize,
        /// The command.
        name: &'static str,
        /// The address field.
        field: &'static str,
    },
    /// A register access outside the whitelist.
    #[error("dword {offset}: {name} accesses register 0x{reg:x}, which is not whitelisted")]
    Register {
        /// Dword offset of the command.
        offset: usize,
        /// The command.
        name: &'static str,
        /// Register byte offset.
        reg: u32,
    },
    /// A store-data-index write that does not stay inside its status page.
    #[error(
        "dword {offset}: {name} writes 0x{len:x} bytes at index 0x{index:x} of a status page, \
         past the page's end"
    )]
    IndexOutOfPage {
        /// Dword offset of the command.
        offset: usize,
        /// The command.
        name: &'static str,
        /// Byte offset into the page.
        index: u64,
        /// Bytes written.
        len: u64,
    },
    /// MI_BATCH_BUFFER_START inside a second-level batch.
    #[error("dword {offset}: MI_BATCH_BUFFER_START inside a second-level batch")]
    NestedBatchStart {
        /// Dword offset of the command.
        offset: usize,
    },
    /// A second-level batch call straight from the ring.
    #[error("dword {offset}: second-level batch started from the ring")]
    SecondLevelFromRing {
        /// Dword offset of the command.
        offset: usize,
    },
}

impl AuditError {
    /// Dword offset of the command the error is about.
    pub fn offset(&self) -> usize {
        match *self {
            AuditError::Forbidden { offset, .. }
            | AuditError::Unmodelled { offset, .. }
            | AuditError::OutOfSlice { offset, .. }
            | AuditError::SurfaceTooLarge { offset, .. }
            | AuditError::SurfaceStateOutOfSlice { offset, .. }
            | AuditError::UnsizedSurface { offset, .. }
            | AuditError::GgttFromUnprivileged { offset, .. }
            | AuditError::Register { offset, .. }
            | AuditError::IndexOutOfPage { offset, .. }
            | AuditError::NestedBatchStart { offset }
            | AuditError::SecondLevelFromRing { offset } => offset,
        }
    }
}

/// Result type of this module.
pub type Result<T> = core::result::Result<T, AuditError>;

/// Register offset field of LRI/LRM/SRM/LRR dwords (bits 22:2).
pub(crate) fn reg_of(dw: u32) -> u32 {
    dw & 0x007f_fffc
}

/// Audits everything about `cmd` except its GGTT ranges (checked by the caller against the
/// slices it cares about).
#[inline]
pub(crate) fn audit_shape(cmd: &Decoded<'_>, ctx: &BatchContext) -> Result<()> {
    let d = cmd.desc;
    if d.flags == Flags::NONE && d.hook == Hook::None {
        return Ok(());
    }
    let offset = cmd.offset;
    let name = d.name;
    if d.flags.has(Flags::REFUSED) {
        return Err(AuditError::Forbidden { offset, name });
    }
    if d.flags.has(Flags::OPAQUE) && ctx.privileged {
        return Err(AuditError::Unmodelled { offset, name });
    }
    let reg = |i: usize, access: RegAccess| -> Result<()> {
        let r = reg_of(cmd.dwords.get(i).copied().unwrap_or(0));
        if register_allowed(cmd.gen, cmd.engine, r, access) {
            Ok(())
        } else {
            Err(AuditError::Register {
                offset,
                name,
                reg: r,
            })
        }
    };
    match d.hook {
        Hook::None | Hook::BatchEnd => {}
        Hook::LoadRegImm => {
            let mut i = 1;
            while i < cmd.dwords.len() {
                reg(i, RegAccess::Write)?;
                i += 2;
            }
        }
        Hook::LoadRegMem => reg(1, RegAccess::Write)?,
        Hook::StoreRegMem => reg(1, RegAccess::Read)?,
        Hook::LoadRegReg => {
            reg(1, RegAccess::Read)?;
            reg(2, RegAccess::Write)?;
        }
        Hook::StatusIndex(_) => {
            if let Some(u) = cmd.status_index() {
                if u.offset
                    .checked_add(u.len)
                    .is_none_or(|end| end > GTT_PAGE_SIZE)
                {
                    return Err(AuditError::IndexOutOfPage {
                        offset,
                        name,
                        index: u.offset,
                        len: u.len,
                    });
                }
                // The engine's global status page is the kernel's, not a user batch's.
                if !u.per_process && !ctx.privileged {
                    return Err(AuditError::GgttFromUnprivileged {
                        offset,
                        name,
                        field: "global status page index",
                    });
                }
            }
        }
        Hook::BatchStart => match ctx.level {
            BatchLevel::Second => return Err(AuditError::NestedBatchStart { offset }),
            BatchLevel::Ring if cmd.is_second_level_call() => {
                return Err(AuditError::SecondLevelFromRing { offset })
            }
            _ => {}
        },
    }
    Ok(())
}

/// Audits one command run from a buffer of context `ctx` by a vGPU owning `slices`.
pub fn audit(cmd: &Decoded<'_>, ctx: &BatchContext, slices: &VgpuSlices) -> Result<()> {
    audit_shape(cmd, ctx)?;
    for u in cmd.addresses(ctx) {
        if u.space != AddressSpace::Ggtt {
            continue;
        }
        check_ggtt(cmd, ctx, &u, slices)?;
    }
    Ok(())
}

pub(crate) fn check_ggtt(
    cmd: &Decoded<'_>,
    ctx: &BatchContext,
    u: &crate::decode::AddressUse,
    slices: &VgpuSlices,
) -> Result<()> {
    let (offset, name, field) = (cmd.offset, cmd.desc.name, u.name);
    if !ctx.privileged {
        return Err(AuditError::GgttFromUnprivileged {
            offset,
            name,
            field,
        });
    }
    if u.len > MAX_SURFACE_BYTES {
        return Err(AuditError::SurfaceTooLarge {
            offset,
            name,
            field,
            len: u.len,
        });
    }
    if !slices.contains(u.start, u.len) {
        return Err(AuditError::OutOfSlice {
            offset,
            name,
            field,
            start: u.start,
            len: u.len,
        });
    }
    Ok(())
}

/// Summary of an audited buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditReport {
    /// Commands audited.
    pub commands: u64,
    /// GGTT address uses checked.
    pub ggtt_uses: u64,
    /// PPGTT address uses seen (not checked: the PPGTT is the caller's to shadow).
    pub ppgtt_uses: u64,
}

/// Errors of [`audit_buffer`].
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum BufferAuditError {
    /// The buffer does not decode.
    #[error(transparent)]
    Decode(#[from] crate::decode::DecodeError),
    /// A command fails the audit.
    #[error(transparent)]
    Audit(#[from] AuditError),
}

/// Decodes and audits a whole buffer of one context (no batch following; see
/// [`audit_walk`](crate::walk::audit_walk) for that).
pub fn audit_buffer(
    gen: crate::Gen,
    engine: crate::Engine,
    dwords: &[u32],
    ctx: &BatchContext,
    slices: &VgpuSlices,
) -> core::result::Result<AuditReport, BufferAuditError> {
    let mut rep = AuditReport::default();
    let mut dec = crate::decode::Decoder::new(gen, engine, dwords);
    while let Some(cmd) = dec.next()? {
        audit_shape(&cmd, ctx)?;
        rep.commands += 1;
        if cmd.desc.addrs.is_empty() {
            continue;
        }
        for u in cmd.addresses(ctx) {
            match u.space {
                AddressSpace::Ggtt => {
                    check_ggtt(&cmd, ctx, &u, slices)?;
                    rep.ggtt_uses += 1;
                }
                AddressSpace::Ppgtt => rep.ppgtt_uses += 1,
            }
        }
    }
    Ok(rep)
}
