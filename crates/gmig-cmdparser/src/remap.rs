//! Remapping: rebase every GGTT address of a command buffer from one slice layout to another.
//!
//! Guarantees (tested by property tests):
//! - only GGTT address bits change; PPGTT addresses and every other bit stay as they are;
//! - each address moves by the delta of the slice its whole range lies in (aperture and hidden
//!   move independently);
//! - all or nothing: the buffer is decoded and audited against the source slices, every new
//!   range is checked against the destination slices, and only then is anything written; on error
//!   the buffer is unchanged;
//! - the output passes the destination audit, and remapping back with
//!   [`SliceMove::inverse`] restores the original bytes.

use thiserror::Error;

use crate::addr::{AddressSpace, SliceMove, MAX_SURFACE_BYTES};
use crate::audit::{self, AuditError};
use crate::decode::{field_raw, AddressUse, BatchContext, DecodeError, Decoded, Decoder};
use crate::table::{Engine, Gen, Width};

/// Why a remap was refused (nothing was changed).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum RemapError {
    /// The buffer does not decode.
    #[error("decode: {0}")]
    Decode(#[from] DecodeError),
    /// The buffer fails the audit against the source slices.
    #[error("source audit: {0}")]
    Source(AuditError),
    /// A rebased range would fail the audit against the destination slices.
    #[error("destination audit: {0}")]
    Destination(AuditError),
    /// A rebased address does not fit its field.
    #[error("dword {offset}: {name} {field}: rebased address 0x{addr:x} does not fit the field")]
    Overflow {
        /// Dword offset of the command.
        offset: usize,
        /// The command.
        name: &'static str,
        /// The field.
        field: &'static str,
        /// The rebased address.
        addr: u64,
    },
}

/// Result type of this module.
pub type Result<T> = core::result::Result<T, RemapError>;

/// What a remap did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemapStats {
    /// Commands decoded.
    pub commands: u64,
    /// GGTT address fields rewritten.
    pub ggtt_rewritten: u64,
    /// PPGTT address fields seen and left alone.
    pub ppgtt_untouched: u64,
}

impl RemapStats {
    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &RemapStats) {
        self.commands += o.commands;
        self.ggtt_rewritten += o.ggtt_rewritten;
        self.ppgtt_untouched += o.ppgtt_untouched;
    }
}

/// One pending rewrite: the field at dword `at` (of the buffer) gets `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edit {
    /// Dword index of the field's low dword within the buffer.
    pub at: usize,
    /// Width of the field.
    pub width: Width,
    /// New raw field value (low dword first).
    pub value: u64,
}

impl Edit {
    /// Applies the edit to `dwords` (which must be the buffer it was planned for). Returns false
    /// when the field does not fit (never the case for planned edits).
    pub fn apply(&self, dwords: &mut [u32]) -> bool {
        let n = self.width.dwords();
        match dwords.get_mut(self.at..self.at.saturating_add(n)) {
            Some(slot) => {
                for (i, d) in slot.iter_mut().enumerate() {
                    *d = (self.value >> (32 * i)) as u32;
                }
                true
            }
            None => false,
        }
    }
}

/// Plans the rewrite of one command: audits it against `mv.from`, rebases each GGTT address,
/// checks the result against `mv.to`, and pushes the edits (`base` is added to dword indices).
#[inline]
pub fn plan_command(
    cmd: &Decoded<'_>,
    ctx: &BatchContext,
    mv: &SliceMove,
    base: usize,
    edits: &mut Vec<Edit>,
    stats: &mut RemapStats,
) -> Result<()> {
    audit::audit_shape(cmd, ctx).map_err(RemapError::Source)?;
    stats.commands += 1;
    if cmd.desc.addrs.is_empty() {
        return Ok(());
    }
    for u in cmd.addresses(ctx) {
        match u.space {
            AddressSpace::Ppgtt => stats.ppgtt_untouched += 1,
            AddressSpace::Ggtt => {
                edits.push(plan_use(cmd, ctx, mv, &u, base)?);
                stats.ggtt_rewritten += 1;
            }
        }
    }
    Ok(())
}

#[inline]
pub(crate) fn plan_use(
    cmd: &Decoded<'_>,
    ctx: &BatchContext,
    mv: &SliceMove,
    u: &AddressUse,
    base: usize,
) -> Result<Edit> {
    let (offset, name, field) = (cmd.offset, cmd.desc.name, u.name);
    // Source audit (the same checks as `audit::check_ggtt`, classifying the range once).
    if !ctx.privileged {
        return Err(RemapError::Source(AuditError::GgttFromUnprivileged {
            offset,
            name,
            field,
        }));
    }
    if u.len > MAX_SURFACE_BYTES {
        return Err(RemapError::Source(AuditError::SurfaceTooLarge {
            offset,
            name,
            field,
            len: u.len,
        }));
    }
    let kind =
        mv.from
            .classify(u.start, u.len)
            .ok_or(RemapError::Source(AuditError::OutOfSlice {
                offset,
                name,
                field,
                start: u.start,
                len: u.len,
            }))?;
    let from = mv.from.slice(kind).base.0;
    let to = mv.to.slice(kind).base.0;
    let moved = |x: u64| {
        if to >= from {
            x.checked_add(to - from)
        } else {
            x.checked_sub(from - to)
        }
    };
    let dest_err = |start| {
        RemapError::Destination(AuditError::OutOfSlice {
            offset,
            name,
            field,
            start,
            len: u.len,
        })
    };
    let new_start = moved(u.start).ok_or(dest_err(u.start))?;
    let new_addr = moved(u.addr).ok_or(dest_err(u.start))?;
    // Destination audit of the new range.
    if !mv.to.slice(kind).contains(new_start, u.len) {
        return Err(dest_err(new_start));
    }
    let mask = crate::table::AddrField::new(field, 0, u.lo)
        .width(u.width)
        .mask();
    if new_addr & !mask != 0 {
        return Err(RemapError::Overflow {
            offset,
            name,
            field,
            addr: new_addr,
        });
    }
    let raw = field_raw(u.width, cmd.dwords, u.dword);
    Ok(Edit {
        at: base.saturating_add(cmd.offset).saturating_add(u.dword),
        width: u.width,
        value: (raw & !mask) | new_addr,
    })
}

/// Rebases every GGTT address in `dwords` (one buffer of context `ctx`) from `mv.from` to `mv.to`.
/// All or nothing: on error `dwords` is unchanged.
pub fn remap_in_place(
    gen: Gen,
    engine: Engine,
    dwords: &mut [u32],
    ctx: &BatchContext,
    mv: &SliceMove,
) -> Result<RemapStats> {
    let mut edits = Vec::new();
    let mut stats = RemapStats::default();
    {
        let mut dec = Decoder::new(gen, engine, dwords);
        while let Some(cmd) = dec.next()? {
            // Offsets are relative to the buffer start already.
            plan_command(&cmd, ctx, mv, 0, &mut edits, &mut stats)?;
        }
    }
    for e in &edits {
        e.apply(dwords);
    }
    Ok(stats)
}
