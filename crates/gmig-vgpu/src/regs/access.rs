//! The guest's MMIO accesses to the vGPU: the GGTT entries, the PV info page, and registers as
//! the rows of [`super::table`] say (a register without a row is a plain store, counted as
//! unmodelled).

use gmig_cmdparser::{GgttOffset, SliceMove};

use super::table::MASTER_IRQ_CONTROL;
use super::{lookup, masked, Behaviour, Handler, Reg};
use crate::gm::PAGE_SIZE;
use crate::mmio::{self, pvinfo};
use crate::vgpu::{Result, Vgpu, VgpuError};
use std::collections::BTreeMap;

/// `STOP_RING` in `RING_MI_MODE`.
const MI_STOP_RING: u32 = 1 << 8;
/// `MODE_IDLE` in `RING_MI_MODE`.
const MI_MODE_IDLE: u32 = 1 << 9;
/// `RESET_CTL_REQUEST_RESET`.
const RESET_CTL_REQUEST: u32 = 1 << 0;
/// `RESET_CTL_READY_TO_RESET`.
const RESET_CTL_READY: u32 = 1 << 1;
/// `RESET_CTL_CAT_ERROR`.
const RESET_CTL_CAT_ERROR: u32 = 1 << 2;
/// `GEN6_PCODE_READY` (busy, really) and `GEN6_PCODE_ERROR_MASK`.
const PCODE_READY: u32 = 1 << 31;
const PCODE_ERROR_MASK: u32 = 0xff;
/// `GEN6_PCODE_DATA`.
const PCODE_DATA: u32 = 0x13_8128;
/// `DP_AUX_CH_CTL` bits.
const AUX_SEND_BUSY: u32 = 1 << 31;
const AUX_STICKY: u32 = (1 << 30) | (1 << 28) | (1 << 25);

fn in_pvinfo(offset: u32) -> bool {
    (mmio::VGT_PVINFO_PAGE..mmio::VGT_PVINFO_PAGE + mmio::VGT_PVINFO_SIZE).contains(&offset)
}

impl Vgpu {
    /// A 32-bit MMIO read by the guest.
    pub fn mmio_read32(&self, offset: u32) -> Result<u32> {
        if !offset.is_multiple_of(4) || offset >= mmio::MMIO_BAR_SIZE {
            return Err(VgpuError::BadMmio { offset, len: 4 });
        }
        if offset >= mmio::GTT_MMIO_BASE {
            let entry = self.gtt_mmio_entry(offset & !7);
            return Ok(if offset.is_multiple_of(8) {
                entry as u32
            } else {
                (entry >> 32) as u32
            });
        }
        if in_pvinfo(offset) {
            return Ok(self.pvinfo_read(offset - mmio::VGT_PVINFO_PAGE));
        }
        match lookup(self.cfg.gen, offset) {
            Some(r) => Ok(self.read_reg(&r)),
            None => {
                if self.unmodelled_offset(offset) {
                    self.unmodelled.note(offset, false);
                }
                Ok(self.vregs.get(&offset).copied().unwrap_or(0))
            }
        }
    }

    /// A 64-bit MMIO read (GGTT entries, the magic).
    pub fn mmio_read64(&self, offset: u32) -> Result<u64> {
        let lo = self.mmio_read32(offset)?;
        let hi = self.mmio_read32(
            offset
                .checked_add(4)
                .ok_or(VgpuError::BadMmio { offset, len: 8 })?,
        )?;
        Ok(u64::from(lo) | (u64::from(hi) << 32))
    }

    /// A 64-bit MMIO write (GGTT entries).
    pub fn mmio_write64(&mut self, offset: u32, value: u64) -> Result<()> {
        self.mmio_write32(offset, value as u32)?;
        self.mmio_write32(
            offset
                .checked_add(4)
                .ok_or(VgpuError::BadMmio { offset, len: 8 })?,
            (value >> 32) as u32,
        )
    }

    /// A 32-bit MMIO write by the guest.
    pub fn mmio_write32(&mut self, offset: u32, value: u32) -> Result<()> {
        self.mmio_write(offset, value, !0)
    }

    /// A write of the bytes of `value` that `enables` selects (0xff per byte written) to the
    /// dword at `offset`: how 1- and 2-byte accesses reach 32-bit registers. Bytes not written
    /// keep their value; for write-1-to-clear and masked registers they write nothing, as with
    /// the hardware's byte enables. The submit port takes whole dwords only.
    pub fn mmio_write(&mut self, offset: u32, value: u32, enables: u32) -> Result<()> {
        if !offset.is_multiple_of(4) || offset >= mmio::MMIO_BAR_SIZE {
            return Err(VgpuError::BadMmio { offset, len: 4 });
        }
        let merge = |old: u32| (old & !enables) | (value & enables);
        if offset >= mmio::GTT_MMIO_BASE {
            let entry_off = offset & !7;
            let old = self.gtt_mmio_entry(entry_off);
            let new = if offset.is_multiple_of(8) {
                (old & !0xffff_ffff) | u64::from(merge(old as u32))
            } else {
                (old & 0xffff_ffff) | (u64::from(merge((old >> 32) as u32)) << 32)
            };
            let page = u64::from(entry_off - mmio::GTT_MMIO_BASE) / 8;
            // Outside the balloon: ignored, as GVT-g does.
            let _ = self.ggtt.set_entry_logged(
                &self.guest_view,
                GgttOffset(page * PAGE_SIZE),
                new,
                self.ggtt_log.as_mut(),
            );
            return Ok(());
        }
        if in_pvinfo(offset) {
            let rel = offset - mmio::VGT_PVINFO_PAGE;
            let value = merge(self.vregs.get(&offset).copied().unwrap_or(0));
            if rel >= pvinfo::DISPLAY_READY {
                self.vregs.insert(offset, value);
            }
            if rel == pvinfo::G2V_NOTIFY {
                self.g2v_notify(value);
            }
            return Ok(());
        }
        match lookup(self.cfg.gen, offset) {
            Some(r) => self.write_reg(&r, value, enables)?,
            None => {
                if self.unmodelled_offset(offset) {
                    self.unmodelled.note(offset, true);
                }
                let v = merge(self.vregs.get(&offset).copied().unwrap_or(0));
                self.vregs.insert(offset, v);
            }
        }
        if let Some(mask) = mmio::address_register(self.cfg.gen, self.cfg.fence_num, offset) {
            let v = self.vregs.get(&offset).copied().unwrap_or(0);
            let shadow = self.shadow_address_reg(v, mask, &self.guest_to_host());
            self.sregs.insert(offset, shadow);
        }
        Ok(())
    }

    /// A register write by a command (`MI_LOAD_REGISTER_IMM` the engine executed): the row's
    /// storage rule (masked registers stay masked), none of the device's actions (the audit
    /// admits only registers without any).
    pub(crate) fn command_reg_write(&mut self, offset: u32, value: u32) {
        let v = match lookup(self.cfg.gen, offset) {
            Some(r) if r.behaviour.is_masked() => masked(self.reg_value(offset), value),
            _ => value,
        };
        self.vregs.insert(offset, v);
    }

    /// What the register at `offset` holds: the last value stored, else its reset value.
    pub(crate) fn reg_value(&self, offset: u32) -> u32 {
        self.vregs
            .get(&offset)
            .copied()
            .unwrap_or_else(|| lookup(self.cfg.gen, offset).map_or(0, |r| r.reset))
    }

    /// Registers the guest touched that the register model has no row for, with the number of
    /// accesses (since this vGPU was created on this host).
    pub fn unmodelled_registers(&self) -> BTreeMap<u32, u64> {
        self.unmodelled.snapshot()
    }

    /// Whether an offset without a row counts as unmodelled (fences are modelled by range).
    fn unmodelled_offset(&self, offset: u32) -> bool {
        mmio::address_register(self.cfg.gen, self.cfg.fence_num, offset).is_none()
    }

    fn read_reg(&self, r: &Reg) -> u32 {
        let v = self.vregs.get(&r.offset).copied().unwrap_or(r.reset);
        match r.behaviour {
            Behaviour::SelfClearing
            | Behaviour::Handler(Handler::Elsp | Handler::GraphicsReset) => 0,
            Behaviour::Handler(Handler::MiMode) => v | ((v & MI_STOP_RING) << 1),
            Behaviour::Handler(Handler::MasterIrq) => (v & MASTER_IRQ_CONTROL) | self.irq_summary(),
            Behaviour::Handler(
                h @ (Handler::Monitor { .. } | Handler::DpllStatus | Handler::PipeCounter(_)),
            ) => self.display_read(h, r.offset, v),
            Behaviour::Handler(Handler::Timestamp { udw }) => {
                let t = super::clock::ticks_now();
                if udw {
                    (t >> 32) as u32
                } else {
                    t as u32
                }
            }
            _ => v,
        }
    }

    fn write_reg(&mut self, r: &Reg, value: u32, enables: u32) -> Result<()> {
        let off = r.offset;
        let old = self.vregs.get(&off).copied().unwrap_or(r.reset);
        let bits = value & enables;
        let merged = (old & !enables) | bits;
        let new = match r.behaviour {
            Behaviour::Store => merged,
            Behaviour::ReadOnly | Behaviour::SelfClearing => return Ok(()),
            Behaviour::WriteOneToClear => old & !bits,
            Behaviour::Masked => masked(old, bits),
            Behaviour::Handler(h) => match h {
                Handler::Forcewake { ack } => {
                    let new = masked(old, bits);
                    self.vregs.insert(ack, new);
                    new
                }
                Handler::GraphicsReset => {
                    self.graphics_reset(merged);
                    return Ok(());
                }
                Handler::EngineResetCtl => {
                    let new = masked(old, bits) & !(RESET_CTL_READY | RESET_CTL_CAT_ERROR);
                    new | ((new & RESET_CTL_REQUEST) << 1)
                }
                Handler::MiMode => masked(old, bits) & !MI_MODE_IDLE,
                Handler::CsbPointer => masked(old, bits),
                Handler::Elsp => {
                    if enables != !0 {
                        return Ok(());
                    }
                    let (engine, _) = mmio::EngineId::from_reg_for(self.cfg.gen, off).ok_or(
                        VgpuError::BadMmio {
                            offset: off,
                            len: 4,
                        },
                    )?;
                    return self.elsp_write(engine, value);
                }
                Handler::MasterIrq => {
                    self.vregs.insert(off, merged & MASTER_IRQ_CONTROL);
                    if old & MASTER_IRQ_CONTROL == 0 {
                        self.irq_line_check(u32::MAX);
                    }
                    return Ok(());
                }
                Handler::GtIir => old & !bits,
                Handler::GtMaskOrEnable => {
                    self.vregs.insert(off, merged);
                    if off & 0xf == 0xc {
                        // An IER enabling a bit that is already pending interrupts.
                        let iir = self.reg_value(off - 4);
                        self.irq_line_check(iir & merged & !old);
                    }
                    return Ok(());
                }
                Handler::PcodeMailbox => {
                    self.pcode_command(merged);
                    merged & !(PCODE_READY | PCODE_ERROR_MASK)
                }
                Handler::RequestAcked { request } => {
                    let req = merged & request;
                    (merged & !(request | (request >> 1))) | req | (req >> 1)
                }
                Handler::Timestamp { .. }
                | Handler::Monitor { .. }
                | Handler::DpllStatus
                | Handler::PipeCounter(_) => return Ok(()),
                Handler::DdiBufCtl | Handler::PlaneSurf => self.display_write(h, off, merged),
                Handler::AuxCtl => {
                    if merged & AUX_SEND_BUSY != 0 {
                        // The transaction ends at once: the monitor's answer, or a timeout.
                        self.aux_transaction(off, merged)
                    } else {
                        (merged & !AUX_STICKY) | (old & AUX_STICKY & !bits)
                    }
                }
            },
        };
        self.vregs.insert(off, new);
        Ok(())
    }

    /// Answers a PCODE mailbox command in `GEN6_PCODE_DATA` as GVT-g does for Skylake.
    fn pcode_command(&mut self, value: u32) {
        let data = self.reg_value(PCODE_DATA);
        let answer = match value & 0xff {
            // GEN6_PCODE_READ_RC6VIDS
            0x05 => data | 1,
            // GEN9_PCODE_READ_MEM_LATENCY: two reads, the first with DATA 0.
            0x06 if data == 0 => 0x1e1a_1100,
            0x06 => 0x6151_4b3d,
            // SKL_PCODE_CDCLK_CONTROL: SKL_CDCLK_READY_FOR_CHANGE.
            0x07 => 0x3,
            // GEN9_PCODE_SAGV_CONTROL: GEN9_SAGV_DISABLE answered GEN9_SAGV_IS_DISABLED.
            0x21 if data == 0 => 0x1,
            _ => data,
        };
        self.vregs.insert(PCODE_DATA, answer);
    }

    pub(crate) fn gtt_mmio_entry(&self, offset: u32) -> u64 {
        let page = u64::from(offset - mmio::GTT_MMIO_BASE) / 8;
        self.ggtt
            .entry(&self.guest_view, GgttOffset(page * PAGE_SIZE))
            .unwrap_or(0)
    }

    fn pvinfo_read(&self, rel: u32) -> u32 {
        let g = &self.guest_view;
        match rel {
            pvinfo::MAGIC => mmio::VGT_MAGIC as u32,
            0x04 => (mmio::VGT_MAGIC >> 32) as u32,
            pvinfo::VERSION_MAJOR => {
                u32::from(mmio::VGT_VERSION_MAJOR) | (u32::from(mmio::VGT_VERSION_MINOR) << 16)
            }
            pvinfo::VGT_ID => self.cfg.vgt_id,
            pvinfo::VGT_CAPS => mmio::VGT_CAPS_FULL_PPGTT | mmio::VGT_CAPS_HWSP_EMULATION,
            pvinfo::APERTURE_BASE => g.aperture.base.0 as u32,
            pvinfo::APERTURE_SIZE => g.aperture.size as u32,
            pvinfo::HIDDEN_BASE => g.hidden.base.0 as u32,
            pvinfo::HIDDEN_SIZE => g.hidden.size as u32,
            pvinfo::FENCE_NUM => self.cfg.fence_num,
            _ => self
                .vregs
                .get(&(mmio::VGT_PVINFO_PAGE + rel))
                .copied()
                .unwrap_or(0),
        }
    }

    /// GVT-g guest-to-vGPU notifications: PPGTT creation and destruction (the root is in
    /// `pdp[0]` of the PV info page).
    fn g2v_notify(&mut self, value: u32) {
        let reg = |o: u32| {
            u64::from(
                self.vregs
                    .get(&(mmio::VGT_PVINFO_PAGE + o))
                    .copied()
                    .unwrap_or(0),
            )
        };
        let root = reg(pvinfo::PDP0_LO) | (reg(pvinfo::PDP0_LO + 4) << 32);
        match value {
            mmio::VGT_G2V_PPGTT_L4_PAGE_TABLE_CREATE => {
                self.ppgtt_roots.insert(root);
            }
            mmio::VGT_G2V_PPGTT_L4_PAGE_TABLE_DESTROY => {
                self.ppgtt_roots.remove(&root);
            }
            _ => {}
        }
    }

    /// Rebases the address bits of a register value; a value outside the source slices becomes 0
    /// (the hardware never sees an address outside the vGPU).
    pub(crate) fn shadow_address_reg(&self, value: u32, mask: u32, mv: &SliceMove) -> u32 {
        let addr = u64::from(value & mask);
        if !self.remap {
            return value;
        }
        match mv.rebase(GgttOffset(addr)) {
            Some(h) => match u32::try_from(h.0) {
                Ok(h) => (h & mask) | (value & !mask),
                Err(_) => 0,
            },
            _ => 0,
        }
    }

    /// The host-side (shadow) value of an address register.
    pub fn shadow_reg(&self, offset: u32) -> Option<u32> {
        self.sregs.get(&offset).copied()
    }
}
