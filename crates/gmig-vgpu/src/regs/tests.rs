//! The register rows' behaviours, through the guest's MMIO accesses.

use super::display::GMBUS2_NO_DEVICE;
use crate::vgpu::{lone_test_vgpu, Vgpu};

fn vgpu() -> Vgpu {
    lone_test_vgpu(3, 1 << 20)
}

#[test]
fn forcewake_requests_are_masked_and_acknowledged_at_once() {
    let mut v = vgpu();
    for (req, ack) in [(0xa278, 0xd84), (0xa188, 0x13_0044), (0xa270, 0xd88)] {
        // i915's fw_domain_reset(), then get (FORCEWAKE_KERNEL) and put.
        v.mmio_write32(req, 0xffff_0000).unwrap();
        assert_eq!(v.mmio_read32(ack).unwrap(), 0);
        v.mmio_write32(req, 0x0001_0001).unwrap();
        assert_eq!(v.mmio_read32(ack).unwrap(), 1);
        assert_eq!(v.mmio_read32(req).unwrap(), 1);
        v.mmio_write32(req, 0x8000_8000).unwrap();
        assert_eq!(v.mmio_read32(ack).unwrap(), 0x8001, "fallback bit too");
        v.mmio_write32(req, 0x0001_0000).unwrap();
        assert_eq!(v.mmio_read32(ack).unwrap(), 0x8000);
        // The acknowledge is read-only.
        v.mmio_write32(ack, 0).unwrap();
        assert_eq!(v.mmio_read32(ack).unwrap(), 0x8000);
    }
}

#[test]
fn engine_reset_control_acknowledges_the_request() {
    let mut v = vgpu();
    for base in [0x2000, 0x2_2000, 0x1_2000, 0x1_a000] {
        let ctl = base + 0xd0;
        // gen8_engine_reset_prepare(): request, wait for READY_TO_RESET.
        v.mmio_write32(ctl, 0x0001_0001).unwrap();
        assert_eq!(v.mmio_read32(ctl).unwrap(), 0b11);
        // gen8_engine_reset_cancel().
        v.mmio_write32(ctl, 0x0001_0000).unwrap();
        assert_eq!(v.mmio_read32(ctl).unwrap(), 0);
        // READY_TO_RESET and CAT_ERROR cannot be set by the guest.
        v.mmio_write32(ctl, 0x0006_0006).unwrap();
        assert_eq!(v.mmio_read32(ctl).unwrap(), 0);
    }
}

#[test]
fn mi_mode_is_masked_and_a_stopped_ring_reads_idle() {
    let mut v = vgpu();
    let mi_mode = 0x2_209c;
    v.mmio_write32(mi_mode, 0x0100_0100).unwrap(); // STOP_RING
    assert_eq!(
        v.mmio_read32(mi_mode).unwrap(),
        0x300,
        "STOP_RING | MODE_IDLE"
    );
    v.mmio_write32(mi_mode, 0x0100_0000).unwrap();
    assert_eq!(v.mmio_read32(mi_mode).unwrap(), 0);
    // RING_MODE_GEN7 keeps only the enabled bits, reads the low half.
    v.mmio_write32(0x229c, 0x0008_0008).unwrap(); // GFX_RUN_LIST_ENABLE
    v.mmio_write32(0x229c, 0x0200_0000).unwrap();
    assert_eq!(v.mmio_read32(0x229c).unwrap(), 0x8);
}

#[test]
fn tlb_invalidations_complete_at_once() {
    let mut v = vgpu();
    for r in [0x4260, 0x4264, 0x4268, 0x426c, 0x4270] {
        v.mmio_write32(r, 1).unwrap();
        assert_eq!(v.mmio_read32(r).unwrap(), 0);
    }
    assert!(v.unmodelled_registers().is_empty());
}

#[test]
fn pcode_mailbox_is_never_busy_and_answers() {
    let mut v = vgpu();
    let (mbox, data) = (0x13_8124, 0x13_8128);
    // SKL_PCODE_CDCLK_CONTROL: ready for a change.
    v.mmio_write32(data, 0).unwrap();
    v.mmio_write32(mbox, (1 << 31) | 0x7).unwrap();
    assert_eq!(v.mmio_read32(mbox).unwrap() & (1 << 31), 0, "not busy");
    assert_eq!(v.mmio_read32(data).unwrap(), 0x3);
    // GEN9_PCODE_READ_MEM_LATENCY: two reads of Skylake's latencies.
    v.mmio_write32(data, 0).unwrap();
    v.mmio_write32(mbox, (1 << 31) | 0x6).unwrap();
    assert_eq!(v.mmio_read32(data).unwrap(), 0x1e1a_1100);
    v.mmio_write32(mbox, (1 << 31) | 0x6).unwrap();
    assert_eq!(v.mmio_read32(data).unwrap(), 0x6151_4b3d);
    assert_eq!(v.mmio_read32(mbox).unwrap() & 0xff, 0, "no error");
}

#[test]
fn display_power_is_granted_and_a_panelless_display_answers() {
    let mut v = vgpu();
    assert_eq!(
        v.mmio_read32(0x4_2000).unwrap(),
        0x8e00_0000,
        "fuses distributed"
    );
    // Power well 1 and 2 requests (bits 1 and 3 of HSW_PWR_WELL_CTL2).
    v.mmio_write32(0x4_5404, 0b1010).unwrap();
    assert_eq!(v.mmio_read32(0x4_5404).unwrap(), 0b1111);
    v.mmio_write32(0x4_5404, 0b0010).unwrap();
    assert_eq!(v.mmio_read32(0x4_5404).unwrap(), 0b0011);
    assert_eq!(
        v.mmio_read32(0x4_6010).unwrap(),
        0xc000_0000,
        "LCPLL locked"
    );
    v.mmio_write32(0x4_5008, 1 << 31).unwrap();
    assert_eq!(
        v.mmio_read32(0x4_5008).unwrap(),
        0xc000_0000,
        "DBUF powered"
    );
    // GMBUS: every address NAKed, the controller idle.
    assert_eq!(v.mmio_read32(0xc_5108).unwrap(), GMBUS2_NO_DEVICE);
    // DP AUX: a transaction ends at once, timed out; writing the status bits clears them.
    let aux = 0x6_4010;
    v.mmio_write32(aux, (1 << 31) | (5 << 20)).unwrap();
    let st = v.mmio_read32(aux).unwrap();
    assert_eq!(st & (1 << 31), 0, "not busy");
    assert_eq!(
        st & ((1 << 30) | (1 << 28)),
        (1 << 30) | (1 << 28),
        "done, timed out"
    );
    v.mmio_write32(aux, st).unwrap();
    assert_eq!(v.mmio_read32(aux).unwrap() & ((1 << 30) | (1 << 28)), 0);
}

#[test]
fn registers_without_a_row_are_stored_and_counted() {
    let mut v = vgpu();
    v.mmio_write32(0x9400, 7).unwrap(); // not modelled
    assert_eq!(v.mmio_read32(0x9400).unwrap(), 7);
    assert_eq!(v.mmio_read32(0x9404).unwrap(), 0);
    let u = v.unmodelled_registers();
    assert_eq!(u.get(&0x9400), Some(&2));
    assert_eq!(u.get(&0x9404), Some(&1));
    // Modelled registers, the PV info page and address registers are not counted.
    v.mmio_read32(0x941c).unwrap();
    v.mmio_read32(crate::mmio::VGT_PVINFO_PAGE).unwrap();
    v.mmio_write32(crate::mmio::FENCE_REG_BASE, 0).unwrap();
    assert_eq!(v.unmodelled_registers().len(), 2);
}

#[test]
fn commands_write_masked_registers_as_the_cpu_does() {
    let mut v = vgpu();
    v.command_reg_write(0x7014, 0x0020_0020);
    v.command_reg_write(0x7014, 0x0001_0001);
    assert_eq!(v.mmio_read32(0x7014).unwrap(), 0x21);
    v.command_reg_write(0x2600, 0xdead_beef);
    assert_eq!(v.mmio_read32(0x2600).unwrap(), 0xdead_beef);
}

/// i915's `intel_uncore_read64_2x32` of `RING_TIMESTAMP` on `base`.
fn timestamp(v: &Vgpu, base: u32) -> u64 {
    let lo = v.mmio_read32(base + 0x358).unwrap();
    let hi = v.mmio_read32(base + 0x35c).unwrap();
    u64::from(lo) | (u64::from(hi) << 32)
}

#[test]
fn timestamps_count_at_12_mhz_on_every_engine_and_ignore_writes() {
    let mut v = vgpu();
    for base in [0x2000, 0x2_2000, 0x1_2000, 0x1_a000] {
        let a = timestamp(&v, base);
        v.mmio_write32(base + 0x358, 0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = timestamp(&v, base);
        // At least 5 ms at 12 MHz (a sleep never returns early); no upper bound on a busy host.
        assert!(b >= a + 60_000, "{base:#x}: {a} -> {b}");
        assert!(v.mmio_read32(base + 0x3a8).unwrap() != 0, "CTX_TIMESTAMP");
    }
}

#[test]
fn the_rps_limits_are_those_of_a_skylake_gt2() {
    let v = vgpu();
    let cap = v.mmio_read32(0x14_5998).unwrap();
    let (rp0, rp1, rpn) = (cap & 0xff, (cap >> 8) & 0xff, (cap >> 16) & 0xff);
    assert!(rp0 >= rp1 && rp1 >= rpn && rpn > 0, "{cap:#x}");
}
