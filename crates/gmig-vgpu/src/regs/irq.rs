//! GT interrupts as GEN8/GEN9 hardware raises them: an engine event sets its bit in the bank's
//! identity register (IIR) unless the mask register (IMR) masks it; the master register sums up
//! the banks with an enabled (IER) bit pending; an interrupt (MSI) is signalled for every enabled
//! event while the master enable is on (as GVT-g injects one per event), and when the master
//! enable comes back on with bits pending (i915's handler turns it off while it works).

use super::table::MASTER_IRQ_CONTROL;
use crate::mmio::{self, EngineId};
use crate::vgpu::Vgpu;

/// `GEN8_MASTER_IRQ`.
pub const MASTER_IRQ: u32 = 0x4_4200;

/// The master-register bits of each GT bank (RCS|BCS, VCS0|VCS1, PM|GuC, VECS).
const BANK_MASTER_BITS: [u32; 4] = [0b11, 0b1100, 0b11_0000, 0b100_0000];

impl Vgpu {
    /// The GT bits of `GEN8_MASTER_IRQ`: a bank's bits are set while its IIR holds an enabled
    /// bit.
    pub(crate) fn gt_irq_summary(&self) -> u32 {
        (0..4u32)
            .filter(|&bank| {
                let iir = mmio::GT_IIR0 + 0x10 * bank;
                self.reg_value(iir) & self.reg_value(iir + 4) != 0
            })
            .map(|bank| BANK_MASTER_BITS[bank as usize])
            .fold(0, |a, b| a | b)
    }

    /// The interrupt bits of `GEN8_MASTER_IRQ`: GT banks and display pipes.
    pub(crate) fn irq_summary(&self) -> u32 {
        self.gt_irq_summary() | self.de_irq_summary()
    }

    /// Whether the guest drives the vGPU by interrupts: it has programmed the master interrupt
    /// register (i915 does when it installs its handler; a driver that polls, like the
    /// project's own guest, never writes it). A VMM runs such a guest's work as soon as it is
    /// submitted: no stream of polling accesses will come to keep pace with.
    pub fn interrupt_driven(&self) -> bool {
        self.vregs.contains_key(&MASTER_IRQ)
    }

    /// Engine `engine` raises the GT interrupt `bits` (e.g. the user or context-switch bit).
    pub(crate) fn raise_engine_irq(&mut self, engine: EngineId, bits: u32) {
        let (iir_off, shift) = engine.irq_bank();
        let latch = (bits << shift) & !self.reg_value(iir_off - 4);
        if latch == 0 {
            return;
        }
        let iir = self.reg_value(iir_off);
        self.vregs.insert(iir_off, iir | latch);
        let ier = self.reg_value(iir_off + 4);
        self.irq_line_check(latch & ier);
    }

    /// Signals an interrupt when `trigger` (the enabled bits an event or a write made pending, or
    /// anything non-zero to re-check) is set, the master enable is on and a bank has an enabled
    /// bit pending.
    pub(crate) fn irq_line_check(&mut self, trigger: u32) {
        if trigger != 0
            && self.reg_value(MASTER_IRQ) & MASTER_IRQ_CONTROL != 0
            && self.irq_summary() != 0
        {
            self.irqs_raised += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::{GT_CONTEXT_SWITCH_INTERRUPT, GT_USER_INTERRUPT};
    use super::*;
    use crate::vgpu::lone_test_vgpu;

    const IMR0: u32 = mmio::GT_IIR0 - 4;
    const IER0: u32 = mmio::GT_IIR0 + 4;

    #[test]
    fn events_latch_unless_masked_and_interrupt_only_when_enabled() {
        let mut v = lone_test_vgpu(1, 1 << 20);
        // Reset state: unmasked, user and context-switch enabled, master on.
        v.raise_engine_irq(EngineId::Blitter, GT_USER_INTERRUPT);
        assert_eq!(v.mmio_read32(mmio::GT_IIR0).unwrap(), 1 << 16);
        assert_eq!(v.interrupts_raised(), 1);
        assert_eq!(
            v.mmio_read32(MASTER_IRQ).unwrap(),
            MASTER_IRQ_CONTROL | 0b11
        );
        // Each enabled event interrupts, pending or not (a guest that never clears the IIR, like
        // the guest-driver model, still gets one per event).
        v.raise_engine_irq(EngineId::Blitter, GT_USER_INTERRUPT);
        assert_eq!(v.interrupts_raised(), 2);
        // i915's handler: master off, IIR cleared by writing it back, master on.
        v.mmio_write32(MASTER_IRQ, 0).unwrap();
        v.raise_engine_irq(EngineId::Render, GT_CONTEXT_SWITCH_INTERRUPT);
        assert_eq!(v.interrupts_raised(), 2, "master off: no interrupt");
        let iir = v.mmio_read32(mmio::GT_IIR0).unwrap();
        assert_eq!(iir, (1 << 16) | (1 << 8));
        v.mmio_write32(mmio::GT_IIR0, 1 << 16).unwrap();
        assert_eq!(
            v.mmio_read32(mmio::GT_IIR0).unwrap(),
            1 << 8,
            "write 1 clears"
        );
        v.mmio_write32(MASTER_IRQ, MASTER_IRQ_CONTROL).unwrap();
        assert_eq!(v.interrupts_raised(), 3, "master on with a bit pending");
        v.mmio_write32(mmio::GT_IIR0, !0).unwrap();
        assert_eq!(v.mmio_read32(MASTER_IRQ).unwrap(), MASTER_IRQ_CONTROL);
        // Masked events do not latch; disabled ones latch without interrupting.
        v.mmio_write32(IMR0, !GT_USER_INTERRUPT).unwrap();
        v.raise_engine_irq(EngineId::Render, GT_CONTEXT_SWITCH_INTERRUPT);
        assert_eq!(v.mmio_read32(mmio::GT_IIR0).unwrap(), 0);
        v.mmio_write32(IMR0, 0).unwrap();
        v.mmio_write32(IER0, 0).unwrap();
        v.raise_engine_irq(EngineId::Render, GT_USER_INTERRUPT);
        assert_eq!(v.mmio_read32(mmio::GT_IIR0).unwrap(), 1);
        assert_eq!(v.interrupts_raised(), 3);
        assert_eq!(v.mmio_read32(MASTER_IRQ).unwrap(), MASTER_IRQ_CONTROL);
        // Enabling the pending bit interrupts.
        v.mmio_write32(IER0, GT_USER_INTERRUPT).unwrap();
        assert_eq!(v.interrupts_raised(), 4);
        // Video engines use banks 1 and 3.
        v.raise_engine_irq(EngineId::VideoEnhance, GT_USER_INTERRUPT);
        assert_eq!(v.mmio_read32(mmio::GT_IIR3).unwrap(), 1);
        assert_ne!(v.mmio_read32(MASTER_IRQ).unwrap() & (1 << 6), 0);
    }
}
