//! What a device adds to the audit ([`audit_widened`]): the rules a vGPU needs beyond
//! [`audit`](crate::audit()) to run what Linux's i915 submits, kept here with the rest of the
//! audit and fed with the device's own data.
//!
//! - **Command-access registers.** `MI_LOAD_REGISTER_IMM` may also write the registers the
//!   device's register model marks as writable from a command buffer (GVT-g's `F_CMD_ACCESS`:
//!   the masked workaround and mode registers i915 writes from every context it creates), each
//!   from the engines the device names ([`CmdRegister`]).
//! - **Null state pointers.** A state pointer at GGTT 0 that sizes nothing is no memory access
//!   ([`null_use`]: i915's null render state programs its pools with base and size 0 and an
//!   all-zero depth buffer). It is admitted from a privileged buffer, and the shadow copy points
//!   it at a page of the vGPU's own ([`redirect_null_uses`]), so that even a later draw through
//!   it cannot leave the vGPU. Every other use is checked as the parser checks it.

use crate::addr::{AddressSpace, VgpuSlices, MAX_SURFACE_BYTES};
use crate::audit::{audit, reg_of, AuditError};
use crate::decode::{AddressUse, BatchContext, Decoded};
use crate::regs::{register_allowed, RegAccess};
use crate::table::{Engine, Hook};

/// A register a command buffer of `engine` may write beyond the parser's whitelist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdRegister {
    /// Register byte offset.
    pub offset: u32,
    /// The engine whose command buffers may write it.
    pub engine: Engine,
}

/// The device's additions to the audit.
#[derive(Clone, Copy, Debug)]
pub struct Widening<'a> {
    /// Registers `MI_LOAD_REGISTER_IMM` may write beyond the whitelist (any order).
    pub cmd_registers: &'a [CmdRegister],
    /// Whether null state pointers are admitted (the caller then shadows them with
    /// [`redirect_null_uses`]).
    pub null_state_pointers: bool,
}

impl Widening<'_> {
    /// Nothing added: [`audit_widened`] is [`audit`].
    pub const NONE: Widening<'static> = Widening {
        cmd_registers: &[],
        null_state_pointers: false,
    };
}

/// [`audit`] with `w`'s additions.
///
/// # Errors
/// The audit's error where the additions do not admit the command.
pub fn audit_widened(
    cmd: &Decoded<'_>,
    ctx: &BatchContext,
    slices: &VgpuSlices,
    w: &Widening<'_>,
) -> Result<(), AuditError> {
    match audit(cmd, ctx, slices) {
        Err(AuditError::Register { .. })
            if cmd.desc.hook == Hook::LoadRegImm && lri_admitted(cmd, w) =>
        {
            Ok(())
        }
        // The audit checks addresses after everything else: the shape passed.
        Err(AuditError::OutOfSlice { start: 0, .. })
            if w.null_state_pointers && ggtt_uses_admitted(cmd, ctx, slices) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Whether every register an `MI_LOAD_REGISTER_IMM` writes is whitelisted or one of `w`'s for
/// the submitting engine.
fn lri_admitted(cmd: &Decoded<'_>, w: &Widening<'_>) -> bool {
    let body = cmd.dwords.get(1..).unwrap_or(&[]);
    body.len().is_multiple_of(2)
        && body.chunks(2).all(|pair| {
            let reg = reg_of(pair[0]);
            register_allowed(cmd.gen, cmd.engine, reg, RegAccess::Write)
                || w.cmd_registers.contains(&CmdRegister {
                    offset: reg,
                    engine: cmd.engine,
                })
        })
}

/// Whether every GGTT use of `cmd` is a null use or passes the audit's checks (privileged
/// buffer, under the surface cap, inside the slices).
fn ggtt_uses_admitted(cmd: &Decoded<'_>, ctx: &BatchContext, slices: &VgpuSlices) -> bool {
    cmd.addresses(ctx)
        .filter(|u| u.space == AddressSpace::Ggtt)
        .all(|u| {
            (ctx.privileged && null_use(cmd, &u))
                || (ctx.privileged && u.len <= MAX_SURFACE_BYTES && slices.contains(u.start, u.len))
        })
}

/// A GGTT state pointer that points nowhere: at address 0 and sizing nothing — 0 bytes, or a
/// command whose dwords past DW0 are all zero (an all-zero `3DSTATE_DEPTH_BUFFER` has no size
/// field of its own).
pub fn null_use(cmd: &Decoded<'_>, u: &AddressUse) -> bool {
    let all_zero = cmd
        .dwords
        .get(1..)
        .is_some_and(|d| d.iter().all(|&x| x == 0));
    u.space == AddressSpace::Ggtt
        && u.addr == 0
        && u.start == 0
        && (u.len == 0 || (!u.bounded && all_zero))
}

/// Points every [`null_use`] of `cmd` in its shadow `dwords` at `to` (a page of the vGPU's own
/// slices, guest view; remapping moves it with the rest).
pub fn redirect_null_uses(cmd: &Decoded<'_>, ctx: &BatchContext, dwords: &mut [u32], to: u64) {
    for u in cmd.addresses(ctx).filter(|u| null_use(cmd, u)) {
        let low_bits = 1u32
            .checked_shl(u32::from(u.lo))
            .map_or(u32::MAX, |b| b - 1);
        if let Some(d) = dwords.get_mut(u.dword) {
            *d = (*d & low_bits) | (to as u32 & !low_bits);
        }
        if u.width.dwords() == 2 {
            if let Some(d) = dwords.get_mut(u.dword + 1) {
                *d = (to >> 32) as u32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{GgttOffset, Slice};
    use crate::decode::decode_one;
    use crate::Gen;

    fn slices() -> VgpuSlices {
        VgpuSlices {
            aperture: Slice::new(GgttOffset(0x0400_0000), 0x0400_0000).unwrap(),
            hidden: Slice::new(GgttOffset(0x4000_0000), 0x1800_0000).unwrap(),
        }
    }

    fn verdict(engine: Engine, dwords: &[u32], w: &Widening<'_>) -> bool {
        let d = decode_one(Gen::Gen9, engine, dwords, 0).unwrap();
        audit_widened(&d, &BatchContext::RING, &slices(), w).is_ok()
    }

    #[test]
    fn command_access_registers_are_admitted_for_their_engine_only() {
        let regs = [CmdRegister {
            offset: 0x7014,
            engine: Engine::Render,
        }];
        let w = Widening {
            cmd_registers: &regs,
            null_state_pointers: false,
        };
        let lri = crate::build::mi_load_register_imm(&[(0x7014, 0x0001_0001)]);
        assert!(!verdict(Engine::Render, &lri, &Widening::NONE));
        assert!(verdict(Engine::Render, &lri, &w));
        assert!(!verdict(Engine::Blitter, &lri, &w));
        // One register outside both lists refuses the whole command.
        let mixed = crate::build::mi_load_register_imm(&[(0x7014, 1), (0x941c, 1)]);
        assert!(!verdict(Engine::Render, &mixed, &w));
    }

    #[test]
    fn null_state_pointers_are_admitted_only_when_asked_and_only_privileged() {
        let w = Widening {
            cmd_registers: &[],
            null_state_pointers: true,
        };
        // 3DSTATE_BINDING_TABLE_POOL_ALLOC with base and size 0.
        let pool_off = [0x7919_0002, 0, 0, 0];
        assert!(!verdict(Engine::Render, &pool_off, &Widening::NONE));
        assert!(verdict(Engine::Render, &pool_off, &w));
        assert!(!verdict(Engine::Render, &[0x7919_0002, 0, 0, 0x1000], &w));
        let d = decode_one(Gen::Gen9, Engine::Render, &pool_off, 0).unwrap();
        let mut shadow = pool_off.to_vec();
        redirect_null_uses(&d, &BatchContext::RING, &mut shadow, 0x0400_0000);
        let sd = decode_one(Gen::Gen9, Engine::Render, &shadow, 0).unwrap();
        assert!(
            audit(&sd, &BatchContext::RING, &slices()).is_ok(),
            "{shadow:x?}"
        );
    }
}
