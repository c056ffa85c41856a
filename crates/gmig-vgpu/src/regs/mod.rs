//! The register model as data: every register the vGPU models is a row with its reset value,
//! its behaviour (plain store, read-only, write-1-to-clear, masked, self-clearing or a device
//! handler), the block it belongs to and whether a guest command buffer may write it
//! (`F_CMD_ACCESS` in GVT-g's `gvt/handlers.c`). The rows are in [`table`]; the device applies
//! them in [`access`].
//!
//! A register without a row is still a plain store (what the vGPU did for every register before
//! the model), but the vGPU counts it and logs its first access
//! ([`crate::Vgpu::unmodelled_registers`]), so a guest that relies on a register the vGPU does
//! not model shows up in the log instead of silently reading what it wrote.
//!
//! What real hardware answers comes from the PRMs and from GVT-g's handlers; what i915 asks from
//! `intel_uncore.c` (forcewake), `intel_reset.c` (GDRST, engine reset), `intel_engine_cs.c`
//! (MI_MODE) and `intel_execlists_submission.c` (CSB). The facts are theirs, the code ours.

pub mod access;
pub mod clock;
pub mod display;
pub mod irq;
pub mod table;
#[cfg(test)]
mod tests;
pub(crate) mod unmodelled;

use gmig_cmdparser::Gen;

use crate::mmio::EngineId;

/// Which part of the GPU a register belongs to (for documentation and the unmodelled-register
/// report).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Block {
    /// Forcewake requests and acknowledges.
    Forcewake,
    /// Fuses: what the GT has (slices, subslices, EUs).
    Fuse,
    /// Whole-GPU and per-engine reset handshakes.
    Reset,
    /// An engine's ring and mode registers.
    Ring,
    /// Execlist submission: ELSP, status, context-status buffer.
    Execlist,
    /// GT interrupt registers (master, IIR, IMR, IER, ISR).
    Interrupt,
    /// GT TLB invalidation.
    Tlb,
    /// Power management, PCODE mailbox, power wells, PLLs: answered, not acted on.
    Power,
    /// Display registers a vGPU without a panel answers (GMBUS, DP AUX) and plane registers.
    Display,
    /// Fault reporting registers the vGPU sets.
    Error,
    /// Workaround ("chicken") and cache-mode registers i915 programs from its contexts.
    Workaround,
}

/// What a register does with reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Reads return the last value written (the reset value before any write).
    Store,
    /// Writes are ignored; reads return the reset value or what the device set.
    ReadOnly,
    /// Writing a 1 clears that bit; zeros leave bits alone.
    WriteOneToClear,
    /// Bits 31:16 of a write select which of bits 15:0 it changes; reads return bits 15:0.
    Masked,
    /// Bits written as 1 start an action the vGPU completes at once: they read back as 0.
    SelfClearing,
    /// The device acts on the access ([`Handler`]).
    Handler(Handler),
}

impl Behaviour {
    /// Whether writes follow the masked convention (upper half enables the lower half).
    pub fn is_masked(self) -> bool {
        matches!(
            self,
            Behaviour::Masked
                | Behaviour::Handler(
                    Handler::Forcewake { .. }
                        | Handler::EngineResetCtl
                        | Handler::MiMode
                        | Handler::CsbPointer
                )
        )
    }
}

/// Registers whose accesses the device acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handler {
    /// A forcewake request (masked); the acknowledge register at `ack` mirrors the request's
    /// bits 15:0 at once (a vGPU's GT never sleeps).
    Forcewake {
        /// Offset of the acknowledge register.
        ack: u32,
    },
    /// `GEN6_GDRST`: the domains written are reset at once and the bits self-clear.
    GraphicsReset,
    /// `RING_RESET_CTL` (masked): `READY_TO_RESET` (bit 1) follows `REQUEST_RESET` (bit 0).
    EngineResetCtl,
    /// `RING_MI_MODE` (masked): `MODE_IDLE` (bit 9) reads as `STOP_RING` (bit 8): the vGPU's
    /// engine stops between workloads, so a stopped ring is idle at once.
    MiMode,
    /// `RING_CONTEXT_STATUS_PTR` (masked): the write pointer (bits 2:0) the vGPU advances and
    /// the read pointer (bits 10:8) the guest keeps.
    CsbPointer,
    /// `RING_ELSP`: the execlist submit port (four writes make a submission; reads 0).
    Elsp,
    /// `GEN8_MASTER_IRQ`: the control bit (31) as written; the GT bits computed from the IIRs.
    MasterIrq,
    /// `GEN8_GT_IIR(n)`: write 1 to clear.
    GtIir,
    /// `GEN8_GT_IMR(n)` and `GEN8_GT_IER(n)`: stored; an enable of a pending bit interrupts.
    GtMaskOrEnable,
    /// `GEN6_PCODE_MAILBOX`: never busy; commands answered as GVT-g answers them.
    PcodeMailbox,
    /// A request/state pair (power wells, PLL enable, DBUF): each state bit follows the request
    /// bit above it (`state = (value & request) >> 1`), at once.
    RequestAcked {
        /// The request bits.
        request: u32,
    },
    /// `DP_AUX_CH_CTL`: a transaction completes at once: on the virtual monitor's channel with
    /// the monitor's answer ([`crate::display`]), elsewhere with a receive timeout (no sink);
    /// writing the status bits clears them.
    AuxCtl,
    /// Read-only: the reset value, with `bits` set while the vGPU has a monitor (port presence
    /// and hot-plug state).
    Monitor {
        /// The bits a connected monitor sets.
        bits: u32,
    },
    /// `DDI_BUF_CTL`: `DDI_BUF_IS_IDLE` (bit 7) reads set while the buffer is disabled (bit 31).
    DdiBufCtl,
    /// `DPLL_STATUS`: each DPLL's lock bit follows its enable bit at once.
    DpllStatus,
    /// A pipe's counters, from the vGPU's display clock ([`crate::display`]); read-only.
    PipeCounter(PipeCounterKind),
    /// `PLANE_SURF`: stored; the write arms a flip that completes at the pipe's next vblank.
    PlaneSurf,
    /// `RING_TIMESTAMP` (`udw`: its upper dword) and `CTX_TIMESTAMP`: the 12 MHz count
    /// ([`clock`]); writes are ignored.
    Timestamp {
        /// The upper 32 bits.
        udw: bool,
    },
}

/// Which of a pipe's counters a register shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipeCounterKind {
    /// `PIPE_FRMCOUNT`: vblanks since the pipe was first enabled.
    Frames,
    /// `PIPE_FLIPCOUNT`: flips completed.
    Flips,
    /// `PIPEDSL`: the line being scanned out.
    ScanLine,
}

/// One modelled register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg {
    /// MMIO offset (absolute; engine rows are given relative to the engine's base in
    /// [`table::ENGINE`] and made absolute by [`lookup`]).
    pub offset: u32,
    /// i915's name for it.
    pub name: &'static str,
    /// Block.
    pub block: Block,
    /// Value before the guest writes it.
    pub reset: u32,
    /// What reads and writes do.
    pub behaviour: Behaviour,
    /// A guest command buffer may write it (`MI_LOAD_REGISTER_IMM`): it changes how the GPU
    /// behaves, not what memory it reaches (GVT-g's `F_CMD_ACCESS`).
    pub cmd_access: bool,
}

/// A row of the table (`offset` absolute or engine-relative).
pub(crate) const fn reg(
    offset: u32,
    name: &'static str,
    block: Block,
    reset: u32,
    behaviour: Behaviour,
) -> Reg {
    Reg {
        offset,
        name,
        block,
        reset,
        behaviour,
        cmd_access: false,
    }
}

/// A row a command buffer may write too.
pub(crate) const fn cmd_reg(
    offset: u32,
    name: &'static str,
    block: Block,
    reset: u32,
    behaviour: Behaviour,
) -> Reg {
    Reg {
        cmd_access: true,
        ..reg(offset, name, block, reset, behaviour)
    }
}

/// The modelled register at `offset` on `gen`, if any (engine rows resolved for the engine whose
/// register window holds it).
pub fn lookup(gen: Gen, offset: u32) -> Option<Reg> {
    if let Some((_, rel)) = EngineId::from_reg_for(gen, offset) {
        if let Ok(i) = table::ENGINE.binary_search_by_key(&rel, |r| r.offset) {
            return Some(Reg {
                offset,
                ..table::ENGINE[i]
            });
        }
    }
    for rows in [table::ABSOLUTE, display::ROWS] {
        if let Ok(i) = rows.binary_search_by_key(&offset, |r| r.offset) {
            return Some(rows[i]);
        }
    }
    None
}

/// Every modelled register a command buffer may write on `gen`, absolute offsets (engine rows
/// once per engine), sorted: the list gmig-cmdparser's register whitelist should admit.
pub fn cmd_access_registers(gen: Gen) -> Vec<u32> {
    let mut v: Vec<u32> = table::ABSOLUTE
        .iter()
        .chain(display::ROWS)
        .filter(|r| r.cmd_access)
        .map(|r| r.offset)
        .collect();
    for e in EngineId::ALL {
        let base = e.mmio_base_for(gen);
        v.extend(
            table::ENGINE
                .iter()
                .filter(|r| r.cmd_access)
                .map(|r| base + r.offset),
        );
    }
    v.sort_unstable();
    v
}

/// The value of a masked write `value` onto `old` (bits 15:0 only are kept).
pub fn masked(old: u32, value: u32) -> u32 {
    let enable = value >> 16;
    ((old & !enable) | (value & enable)) & 0xffff
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn rows_are_sorted_unique_and_outside_the_engine_windows() {
        for rows in [table::ABSOLUTE, table::ENGINE, display::ROWS] {
            for w in rows.windows(2) {
                assert!(
                    w[0].offset < w[1].offset,
                    "{} and {} out of order",
                    w[0].name,
                    w[1].name
                );
            }
            for r in rows {
                assert!(r.offset.is_multiple_of(4), "{} misaligned", r.name);
            }
        }
        for r in display::ROWS {
            assert!(
                lookup(Gen::Gen9, r.offset) == Some(*r),
                "{} is hidden by another row",
                r.name
            );
        }
        // A fixed-offset row inside an engine's window (a render-only register) must not shadow
        // an engine row.
        for r in table::ABSOLUTE {
            for gen in [Gen::Gen8, Gen::Gen9, Gen::Gen11] {
                if let Some((_, rel)) = EngineId::from_reg_for(gen, r.offset) {
                    assert!(
                        table::ENGINE.iter().all(|e| e.offset != rel),
                        "{} is hidden by an engine row",
                        r.name
                    );
                }
            }
        }
        for r in table::ENGINE {
            assert!(r.offset < 0x800, "{} outside the engine window", r.name);
        }
    }

    #[test]
    fn lookup_resolves_engine_rows_for_every_engine() {
        for e in EngineId::ALL {
            let r = lookup(Gen::Gen9, e.mmio_base() + 0xd0).unwrap();
            assert_eq!(r.name, "RING_RESET_CTL");
            assert_eq!(r.offset, e.mmio_base() + 0xd0);
        }
        assert_eq!(lookup(Gen::Gen9, 0x941c).unwrap().name, "GEN6_GDRST");
        assert_eq!(
            lookup(Gen::Gen11, 0x1c_0000 + 0x230).unwrap().behaviour,
            Behaviour::Handler(Handler::Elsp)
        );
        assert!(
            lookup(Gen::Gen9, 0x2600).is_none(),
            "CS_GPR is not modelled"
        );
    }

    #[test]
    fn masked_writes_change_only_the_enabled_bits() {
        assert_eq!(masked(0, 0x0001_0001), 1);
        assert_eq!(masked(1, 0x0001_0000), 0);
        assert_eq!(masked(0x00f0, 0x0000_000f), 0x00f0, "no enable, no change");
        assert_eq!(masked(0x00f0, 0xffff_0000), 0);
    }

    #[test]
    fn command_access_list_holds_the_context_workaround_registers() {
        let v = cmd_access_registers(Gen::Gen9);
        for r in [0x7014, 0x229c, 0x209c] {
            assert!(v.contains(&r), "{r:#x}");
        }
        assert!(!v.contains(&0x2230), "ELSP is not command-writable");
        assert!(!v.contains(&0x941c), "GDRST is not command-writable");
    }
}
