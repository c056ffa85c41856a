use super::*;
use crate::checkpoint::{RestoreOptions, VgpuState};
use crate::gm::{HostConfig, PartitionManager, VgpuType};
use crate::regs::display::{PLANE_CTL_A, PLANE_SIZE_A, PLANE_STRIDE_A, PLANE_SURF_A};
use crate::regs::irq::MASTER_IRQ;
use crate::regs::table::MASTER_IRQ_CONTROL;
use crate::vgpu::lone_test_vgpu;

const PIPE_IMR_A: u32 = DE_PIPE_IIR_A - 4;
const PIPE_IER_A: u32 = DE_PIPE_IIR_A + 4;
const FRMCOUNT_A: u32 = 0x7_0040;
const FLIPCOUNT_A: u32 = 0x7_0044;
const PIPEDSL_A: u32 = 0x7_0000;
const SDEISR: u32 = 0xc_4000;
const SFUSE_STRAP: u32 = 0xc_2014;
const AUX_D: u32 = 0x6_4310;

/// An AUX transaction on channel D through the registers, as i915's `intel_dp_aux_xfer` does:
/// the reply bytes, or the error bits of the control register.
fn aux(v: &mut Vgpu, req: &[u8]) -> Result<Vec<u8>, u32> {
    let mut padded = [0u8; 20];
    padded[..req.len()].copy_from_slice(req);
    for (i, c) in padded.chunks(4).enumerate() {
        let w = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        v.mmio_write32(AUX_D + 4 + 4 * i as u32, w).unwrap();
    }
    // SEND_BUSY | DONE | TIME_OUT_ERROR | RECEIVE_ERROR (written to clear) | size.
    let ctl = (1 << 31) | (1 << 30) | (1 << 28) | (1 << 25) | ((req.len() as u32) << 20);
    v.mmio_write32(AUX_D, ctl).unwrap();
    let st = v.mmio_read32(AUX_D).unwrap();
    assert_eq!(st & (1 << 31), 0, "still busy");
    assert_ne!(st & (1 << 30), 0, "not done");
    if st & ((1 << 28) | (1 << 25)) != 0 {
        return Err(st & ((1 << 28) | (1 << 25)));
    }
    let n = ((st >> 20) & 0x1f) as usize;
    let mut out = Vec::new();
    for i in 0..5 {
        out.extend(v.mmio_read32(AUX_D + 4 + 4 * i).unwrap().to_be_bytes());
    }
    out.truncate(n);
    Ok(out)
}

#[test]
fn the_monitor_is_on_port_d_and_answers_dpcd_and_edid_over_aux() {
    let mut v = lone_test_vgpu(1, 1 << 20);
    assert_eq!(
        v.display().monitor,
        Some(Resolution::XGA),
        "the type's size"
    );
    assert_ne!(v.mmio_read32(SDEISR).unwrap() & (1 << 23), 0, "hot-plug D");
    assert_eq!(v.mmio_read32(SFUSE_STRAP).unwrap() & 1, 1, "DDI D strapped");
    // Receiver caps.
    let r = aux(&mut v, &[0x90, 0x00, 0x00, 0x0e]).unwrap();
    assert_eq!(&r[..4], &[0x00, 0x12, 0x14, 0x84]);
    // The EDID, as drm reads it: offset write, 16-byte reads, stop.
    aux(&mut v, &[0x40, 0x00, 0x50]).unwrap();
    aux(&mut v, &[0x40, 0x00, 0x50, 0x00, 0x00]).unwrap();
    let mut e = Vec::new();
    for _ in 0..8 {
        let r = aux(&mut v, &[0x50, 0x00, 0x50, 0x0f]).unwrap();
        assert_eq!(r.len(), 17);
        e.extend_from_slice(&r[1..]);
    }
    aux(&mut v, &[0x10, 0x00, 0x50]).unwrap();
    let m = edid::parse_preferred(&e).unwrap();
    assert_eq!((m.hactive, m.vactive), (1024, 768));
    // Other channels have no sink: they time out.
    v.mmio_write32(0x6_4110, (1 << 31) | (4 << 20)).unwrap();
    assert_ne!(v.mmio_read32(0x6_4110).unwrap() & (1 << 28), 0);
}

#[test]
fn without_a_monitor_no_port_is_present_and_aux_times_out() {
    let mut v = lone_test_vgpu(1, 1 << 20);
    v.set_monitor(None);
    assert_eq!(v.mmio_read32(SDEISR).unwrap(), 0);
    assert_eq!(v.mmio_read32(SFUSE_STRAP).unwrap(), 0);
    assert_eq!(aux(&mut v, &[0x90, 0x00, 0x00, 0x0e]), Err(1 << 28));
}

#[test]
fn vblanks_count_frames_at_the_modes_rate_and_interrupt() {
    let mut v = lone_test_vgpu(1, 1 << 20);
    let period = v.display().frame_period();
    // 1024x768 at 65 MHz: 1344 x 806 pixels a frame.
    assert_eq!(period, 1344 * 806 * 12 / 65);
    // A pipe off counts nothing.
    v.display_tick(1_000_000);
    assert_eq!(v.mmio_read32(FRMCOUNT_A).unwrap(), 0);
    assert_eq!(v.next_vblank(), None);
    // i915: vblank unmasked and enabled, pipe on.
    v.mmio_write32(PIPE_IMR_A, !PIPE_VBLANK).unwrap();
    v.mmio_write32(PIPE_IER_A, PIPE_VBLANK | PIPE_FLIP_DONE)
        .unwrap();
    v.mmio_write32(PIPECONF_A, PIPECONF_ENABLE).unwrap();
    assert_eq!(v.mmio_read32(PIPECONF_A).unwrap() >> 30, 0b11, "state on");
    let t0 = 2_000_000;
    v.display_tick(t0);
    assert_eq!(v.next_vblank(), Some(t0 + period));
    let irqs = v.interrupts_raised();
    v.display_tick(t0 + period - 1);
    assert_eq!(v.mmio_read32(FRMCOUNT_A).unwrap(), 0, "not yet");
    v.display_tick(t0 + period);
    assert_eq!(v.mmio_read32(FRMCOUNT_A).unwrap(), 1);
    assert_eq!(v.interrupts_raised(), irqs + 1);
    assert_eq!(v.mmio_read32(DE_PIPE_IIR_A).unwrap(), PIPE_VBLANK);
    assert_eq!(
        v.mmio_read32(MASTER_IRQ).unwrap(),
        MASTER_IRQ_CONTROL | (1 << 16),
        "the pipe's bit in the master register"
    );
    v.mmio_write32(DE_PIPE_IIR_A, PIPE_VBLANK).unwrap();
    assert_eq!(v.mmio_read32(MASTER_IRQ).unwrap(), MASTER_IRQ_CONTROL);
    // One second of ticks every millisecond: the mode's rate (60 Hz), one interrupt per vblank.
    let start = t0 + period;
    for ms in 1..=1000 {
        v.display_tick(start + ms * 12_000);
    }
    let frames = v.mmio_read32(FRMCOUNT_A).unwrap() - 1;
    assert_eq!(u64::from(frames), 12_000_000 / period);
    assert_eq!(v.interrupts_raised(), irqs + 1 + u64::from(frames));
    // A gap counts every vblank in it, with one interrupt.
    let before = v.mmio_read32(FRMCOUNT_A).unwrap();
    let irqs = v.interrupts_raised();
    v.display_tick(start + 1000 * 12_000 + 10 * period);
    assert_eq!(v.mmio_read32(FRMCOUNT_A).unwrap(), before + 10);
    assert_eq!(v.interrupts_raised(), irqs + 1);
    // Masked: counted, not latched.
    v.mmio_write32(DE_PIPE_IIR_A, !0).unwrap();
    v.mmio_write32(PIPE_IMR_A, !0).unwrap();
    v.display_tick(start + 1000 * 12_000 + 12 * period);
    assert_eq!(v.mmio_read32(FRMCOUNT_A).unwrap(), before + 12);
    assert_eq!(v.mmio_read32(DE_PIPE_IIR_A).unwrap(), 0);
    // Pipe off: the counter holds; the state bit follows.
    v.mmio_write32(PIPECONF_A, 0).unwrap();
    assert_eq!(v.mmio_read32(PIPECONF_A).unwrap(), 0);
    v.display_tick(start + 2000 * 12_000);
    assert_eq!(v.mmio_read32(FRMCOUNT_A).unwrap(), before + 12);
}

#[test]
fn a_plane_surface_write_flips_at_the_next_vblank() {
    let mut v = lone_test_vgpu(1, 1 << 20);
    v.mmio_write32(PIPE_IMR_A, 0).unwrap();
    v.mmio_write32(PIPE_IER_A, PIPE_FLIP_DONE).unwrap();
    v.mmio_write32(PIPECONF_A, PIPECONF_ENABLE).unwrap();
    let period = v.display().frame_period();
    v.display_tick(0);
    v.display_tick(period);
    assert_eq!(v.mmio_read32(FLIPCOUNT_A).unwrap(), 0);
    let surf = v.guest_view().aperture.base.0 as u32;
    v.mmio_write32(PLANE_SURF_A, surf).unwrap();
    v.mmio_write32(DE_PIPE_IIR_A, !0).unwrap();
    let irqs = v.interrupts_raised();
    v.display_tick(2 * period);
    assert_eq!(v.mmio_read32(FLIPCOUNT_A).unwrap(), 1);
    assert_eq!(
        v.mmio_read32(DE_PIPE_IIR_A).unwrap(),
        PIPE_VBLANK | PIPE_FLIP_DONE
    );
    assert_eq!(v.interrupts_raised(), irqs + 1, "flip done is enabled");
    v.display_tick(3 * period);
    assert_eq!(v.mmio_read32(FLIPCOUNT_A).unwrap(), 1, "one flip");
}

#[test]
fn the_scan_line_moves_with_the_clock_and_reads_before_vblank_when_one_is_near() {
    let mut v = lone_test_vgpu(1, 1 << 20);
    v.mmio_write32(PIPECONF_A, PIPECONF_ENABLE).unwrap();
    let period = v.display().frame_period();
    v.display_tick(0);
    // At the vblank: line 768 (the first blank line).
    assert_eq!(v.mmio_read32(PIPEDSL_A).unwrap(), 768);
    v.display_tick(period / 2);
    // Half a frame (rounded down) later: 402 lines on, past the last line (806 in all).
    assert_eq!(v.mmio_read32(PIPEDSL_A).unwrap(), 768 + 402 - 806);
    v.display_tick(period - VBLANK_GUARD_TICKS + 1);
    assert_eq!(
        v.mmio_read32(PIPEDSL_A).unwrap(),
        766,
        "inside i915's evasion window"
    );
}

#[test]
fn display_state_survives_a_checkpoint_round_trip_and_a_move() {
    let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
    let (_, a) = pm.place(VgpuType::V5_4).unwrap();
    let (_, b) = pm.place(VgpuType::V5_4).unwrap();
    let ram = crate::gtt::new_guest_ram(1 << 20).unwrap();
    let cfg = crate::vgpu::VgpuConfig::new(VgpuType::V5_4, 1);
    let mut v = Vgpu::new(cfg, a, ram.clone()).unwrap();
    assert_eq!(v.display().monitor, Some(Resolution::WUXGA));
    v.mmio_write32(PIPECONF_A, PIPECONF_ENABLE).unwrap();
    let period = v.display().frame_period();
    v.display_tick(0);
    v.display_tick(7 * period + 5);
    aux(&mut v, &[0x80, 0x01, 0x00, 0x00, 0x0a]).unwrap();
    aux(&mut v, &[0x40, 0x00, 0x50, 0x00, 0x20]).unwrap();
    v.mmio_write32(PLANE_SURF_A, a.aperture.base.0 as u32)
        .unwrap();
    let bytes = v.save().to_bytes();
    let state = VgpuState::from_bytes(&bytes).unwrap();
    assert_eq!(state.display, *v.display());
    let mut w = Vgpu::restore(&state, ram, b, RestoreOptions::default()).unwrap();
    assert_eq!(w.display(), v.display());
    assert_eq!(w.mmio_read32(FRMCOUNT_A).unwrap(), 7);
    // The destination goes on: the armed flip completes, the link config and the EDID offset
    // came along.
    w.display_tick(8 * period);
    assert_eq!(w.mmio_read32(FRMCOUNT_A).unwrap(), 8);
    assert_eq!(w.mmio_read32(FLIPCOUNT_A).unwrap(), 1);
    assert_eq!(
        aux(&mut w, &[0x90, 0x01, 0x00, 0x00]).unwrap(),
        vec![0, 0x0a]
    );
    let edid = edid::generate(Resolution::WUXGA);
    let r = aux(&mut w, &[0x50, 0x00, 0x50, 0x00]).unwrap();
    assert_eq!(r, vec![0, edid[0x20]]);
}

#[test]
fn a_version_2_checkpoint_loads_without_a_monitor() {
    let v = lone_test_vgpu(1, 1 << 20);
    let state = v.save();
    // A version-2 envelope: the body without the display section.
    let body = postcard::to_stdvec(&state).unwrap();
    let mut bytes = b"GMIGVGPU".to_vec();
    bytes.extend(2u16.to_le_bytes());
    bytes.extend(0u16.to_le_bytes());
    bytes.extend((body.len() as u32).to_le_bytes());
    bytes.extend(crc32fast::hash(&body).to_le_bytes());
    bytes.extend(&body);
    let old = VgpuState::from_bytes(&bytes).unwrap();
    assert_eq!(old.display.monitor, None);
    // A version-3 body without its section is refused.
    bytes[8] = 3;
    assert!(VgpuState::from_bytes(&bytes).is_err());
}

/// Maps the first 8 pages of the aperture to guest frames 0x100.. through the GGTT; the
/// aperture's base.
fn map_aperture_pages(v: &mut Vgpu) -> u64 {
    let base = v.guest_view().aperture.base.0;
    for i in 0..8u64 {
        let pte = ((0x100 + i) << 12) | 1;
        v.mmio_write64(
            crate::mmio::GTT_MMIO_BASE + ((base >> 12) + i) as u32 * 8,
            pte,
        )
        .unwrap();
    }
    base
}

#[test]
fn the_primary_plane_scans_out_linear_and_x_tiled_surfaces_through_the_ggtt() {
    let mut v = lone_test_vgpu(1, 4 << 20);
    // 8 pages of the aperture at guest frames 0x100..; a 64x32 XRGB gradient drawn there.
    let base = map_aperture_pages(&mut v);
    let (w, h) = (64u32, 32u32);
    let px = |x: u32, y: u32| (x * 4) << 16 | (y * 8) << 8 | (x ^ y);
    let write = |v: &Vgpu, off: usize, val: u32| {
        use vm_memory::Bytes;
        v.guest_memory()
            .write_slice(
                &val.to_le_bytes(),
                vm_memory::GuestAddress(0x10_0000 + off as u64),
            )
            .unwrap();
    };
    for y in 0..h {
        for x in 0..w {
            write(&v, (y * 256 + x * 4) as usize, px(x, y));
        }
    }
    assert!(matches!(v.scan_out(0), Err(plane::PlaneError::Disabled(0))));
    v.mmio_write32(PLANE_SURF_A, base as u32).unwrap();
    v.mmio_write32(PLANE_STRIDE_A, 256 / 64).unwrap();
    v.mmio_write32(PLANE_SIZE_A, ((h - 1) << 16) | (w - 1))
        .unwrap();
    v.mmio_write32(PLANE_CTL_A, (1 << 31) | (4 << 24)).unwrap();
    let f = v.scan_out(0).unwrap();
    assert_eq!((f.width, f.height), (w, h));
    for y in 0..h {
        for x in 0..w {
            assert_eq!(f.pixels[(y * w + x) as usize], px(x, y) & 0xff_ffff);
        }
    }
    // The same picture X-tiled (one tile is 128 pixels x 8 rows here: stride 512).
    for y in 0..h {
        for x in 0..w {
            let off = (y / 8) * 4096 + (y % 8) * 512 + x * 4;
            write(&v, off as usize, px(x, y));
        }
    }
    v.mmio_write32(PLANE_STRIDE_A, 1).unwrap();
    v.mmio_write32(PLANE_CTL_A, (1 << 31) | (4 << 24) | (1 << 10))
        .unwrap();
    assert_eq!(v.scan_out(0).unwrap(), f);
    // Out of range sizes and unmapped surfaces are errors.
    v.mmio_write32(PLANE_SIZE_A, (4095 << 16) | 8191).unwrap();
    assert!(matches!(
        v.scan_out(0),
        Err(plane::PlaneError::Geometry { .. })
    ));
    v.mmio_write32(PLANE_SIZE_A, ((h - 1) << 16) | (w - 1))
        .unwrap();
    v.mmio_write32(PLANE_SURF_A, base as u32 + 0x10_0000)
        .unwrap();
    assert!(matches!(v.scan_out(0), Err(plane::PlaneError::Memory(_))));
}

/// The pipe CRC: off, a vblank latches nothing; on, each vblank latches the words of what the
/// pipe scans out and raises CRC-done; the same picture gives the same words, another picture
/// other words; a plane that is off sends black.
#[test]
fn the_pipe_crc_latches_what_the_pipe_scans_out_at_each_vblank() {
    use super::crc::{PIPE_CRC_CTL_A, PIPE_CRC_DONE, PIPE_CRC_ENABLE, PIPE_CRC_RES_1_A};
    let mut v = lone_test_vgpu(1, 4 << 20);
    let base = map_aperture_pages(&mut v);
    let fill = |v: &Vgpu, val: u32| {
        use vm_memory::Bytes;
        let bytes: Vec<u8> = (0..8 * 1024).flat_map(|_| val.to_le_bytes()).collect();
        v.guest_memory()
            .write_slice(&bytes, vm_memory::GuestAddress(0x10_0000))
            .unwrap();
    };
    fill(&v, 0x00ff_0000);
    v.mmio_write32(PLANE_SURF_A, base as u32).unwrap();
    v.mmio_write32(PLANE_STRIDE_A, 256 / 64).unwrap();
    v.mmio_write32(PLANE_SIZE_A, (31 << 16) | 63).unwrap();
    v.mmio_write32(PLANE_CTL_A, (1 << 31) | (4 << 24)).unwrap();
    v.mmio_write32(PIPE_IMR_A, 0).unwrap();
    v.mmio_write32(PIPE_IER_A, PIPE_VBLANK | PIPE_CRC_DONE)
        .unwrap();
    v.mmio_write32(PIPECONF_A, PIPECONF_ENABLE).unwrap();
    let period = v.display().frame_period();
    let words = |v: &Vgpu| -> Vec<u32> {
        (0..5)
            .map(|i| v.mmio_read32(PIPE_CRC_RES_1_A + 4 * i).unwrap())
            .collect()
    };
    let mut t = 0;
    let mut vblank = |v: &mut Vgpu| {
        v.mmio_write32(DE_PIPE_IIR_A, !0).unwrap();
        t += period;
        v.display_tick(t);
        v.mmio_read32(DE_PIPE_IIR_A).unwrap()
    };
    // The pipe is seen on, then the first vblank completes the plane's flip.
    vblank(&mut v);
    vblank(&mut v);
    assert_eq!(vblank(&mut v), PIPE_VBLANK, "CRC off: no CRC-done");
    assert_eq!(words(&v), vec![0; 5], "CRC off: nothing latched");
    v.mmio_write32(PIPE_CRC_CTL_A, PIPE_CRC_ENABLE).unwrap();
    assert_eq!(vblank(&mut v), PIPE_VBLANK | PIPE_CRC_DONE);
    let red = words(&v);
    assert_ne!(red, vec![0; 5]);
    assert_eq!(vblank(&mut v), PIPE_VBLANK | PIPE_CRC_DONE);
    assert_eq!(words(&v), red, "the same picture, the same words");
    fill(&v, 0x0000_00ff);
    vblank(&mut v);
    let blue = words(&v);
    assert_ne!(blue, red, "another picture, other words");
    // The same blue picture X-tiled (64 pixels fit one tile row of 512 bytes): the same words.
    {
        use vm_memory::Bytes;
        let bytes: Vec<u8> = (0..8 * 1024).flat_map(|_| 0xffu32.to_le_bytes()).collect();
        v.guest_memory()
            .write_slice(&bytes, vm_memory::GuestAddress(0x10_0000))
            .unwrap();
    }
    v.mmio_write32(PLANE_STRIDE_A, 1).unwrap();
    v.mmio_write32(PLANE_CTL_A, (1 << 31) | (4 << 24) | (1 << 10))
        .unwrap();
    vblank(&mut v);
    assert_eq!(words(&v), blue, "the same pixels in another tiling");
    // Plane off: black of the pipe's source size, which differs from both.
    v.mmio_write32(crate::regs::display::PIPESRC_A, (63 << 16) | 31)
        .unwrap();
    v.mmio_write32(PLANE_CTL_A, 0).unwrap();
    vblank(&mut v);
    let black = words(&v);
    assert!(black != red && black != blue);
    let frame = plane::Frame {
        width: 64,
        height: 32,
        pixels: vec![0; 64 * 32],
    };
    assert_eq!(black, super::crc::crc_words(&frame).to_vec());
}

/// The registers [`reads_display_clock`] names are exactly those whose reads a tick changes:
/// with every pipe on, its vblank, flip-done and CRC-done interrupts enabled, a flip armed and
/// its CRC on, every modelled register is read before and after a tick past the next vblank
/// (and the scan line moves between two ticks in one frame). A register a tick changes but the
/// set lacks would read stale between ticks; one the set names needlessly costs a tick.
#[test]
fn the_reads_that_tick_the_display_clock_are_those_whose_values_it_changes() {
    use super::crc::{PIPE_CRC_CTL_A, PIPE_CRC_DONE, PIPE_CRC_ENABLE, PIPE_CRC_RES_1_A};
    let mut v = lone_test_vgpu(1, 1 << 20);
    let bits = PIPE_VBLANK | PIPE_FLIP_DONE | PIPE_CRC_DONE;
    for p in 0..3 {
        let pipe = PIPE_STRIDE * p;
        v.mmio_write32(PIPE_IMR_A + 0x10 * p, !bits).unwrap();
        v.mmio_write32(PIPE_IER_A + 0x10 * p, bits).unwrap();
        v.mmio_write32(PIPECONF_A + pipe, PIPECONF_ENABLE).unwrap();
        v.mmio_write32(PIPE_CRC_CTL_A + pipe, PIPE_CRC_ENABLE)
            .unwrap();
    }
    let period = v.display().frame_period();
    v.display_tick(period);
    for p in 0..3 {
        v.mmio_write32(PLANE_SURF_A + PIPE_STRIDE * p, 0x1000)
            .unwrap();
    }
    // The modelled rows, and the CRC results, which the pipes latch without a row.
    let crc_results =
        (0..3).flat_map(|p| (0..5).map(move |i| PIPE_CRC_RES_1_A + PIPE_STRIDE * p + 4 * i));
    let rows: Vec<u32> = crate::regs::table::ABSOLUTE
        .iter()
        .chain(crate::regs::display::ROWS)
        .map(|r| r.offset)
        .chain(crc_results)
        .collect();
    let read = |v: &Vgpu| -> Vec<u32> { rows.iter().map(|&r| v.mmio_read32(r).unwrap()).collect() };
    let changed = |v: &mut Vgpu, to: u64| -> Vec<u32> {
        let before = read(v);
        v.display_tick(to);
        let after = read(v);
        rows.iter()
            .zip(before.iter().zip(&after))
            .filter(|(_, (b, a))| b != a)
            .map(|(&r, _)| r)
            .collect()
    };
    let mut seen = changed(&mut v, period + period / 3);
    let at_vblank = changed(&mut v, 2 * period);
    assert!(!at_vblank.is_empty());
    seen.extend(at_vblank);
    seen.sort_unstable();
    seen.dedup();
    let mut named: Vec<u32> = rows
        .iter()
        .copied()
        .filter(|&r| reads_display_clock(r.into(), 4))
        .collect();
    named.sort_unstable();
    assert_eq!(seen, named);
    assert_eq!(
        named.len(),
        3 * (3 + 5 + 1) + 1,
        "every register of the set is a row"
    );
    // Reads of other widths: an 8-byte read holding one, a byte of one.
    assert!(reads_display_clock(0x7_0040, 8));
    assert!(reads_display_clock(u64::from(MASTER_IRQ) + 3, 1));
    assert!(!reads_display_clock(u64::from(PLANE_CTL_A), 4));
    assert!(!reads_display_clock(0x7_0004, 4));
}

/// The words as they were first computed: the frame copied into one buffer, then hashed.
fn copied_then_hashed(frame: &plane::Frame) -> [u32; 5] {
    let mut bytes = Vec::with_capacity(8 + frame.pixels.len() * 4);
    bytes.extend_from_slice(&frame.width.to_le_bytes());
    bytes.extend_from_slice(&frame.height.to_le_bytes());
    bytes.extend(
        frame
            .pixels
            .iter()
            .flat_map(|p| (p & 0x00ff_ffff).to_le_bytes()),
    );
    let h = xxhash_rust::xxh3::xxh3_128(&bytes);
    [
        h as u32,
        (h >> 32) as u32,
        (h >> 64) as u32,
        (h >> 96) as u32,
        crc32fast::hash(&bytes),
    ]
}

/// Frames of odd sizes (a last piece shorter than a chunk, one pixel, more than one chunk,
/// a 1024x768 screen) with alpha bits set: the streamed words equal the copied ones, and a
/// black frame's words equal those of a frame of zeros.
#[test]
fn streamed_words_equal_the_words_of_the_copied_frame() {
    let mut x = 0x9e37_79b9u32;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    for (w, h) in [(1, 1), (7, 3), (1000, 3), (1025, 2), (1024, 768)] {
        let frame = plane::Frame {
            width: w,
            height: h,
            pixels: (0..w * h).map(|_| next()).collect(),
        };
        assert_eq!(
            super::crc::crc_words(&frame),
            copied_then_hashed(&frame),
            "{w}x{h}"
        );
        let black = plane::Frame {
            pixels: vec![0; (w * h) as usize],
            ..frame
        };
        assert_eq!(
            super::crc::black_words(w, h),
            copied_then_hashed(&black),
            "{w}x{h} black"
        );
    }
}

/// A plane whose rows are wider than what it shows (a 100x20 window at (5, 2) of a 512-byte
/// stride surface of varied pixels): the words the pipe latches are those of the frame it scans
/// out, copied and hashed.
#[test]
fn the_latched_words_of_a_strided_plane_equal_those_of_its_copied_frame() {
    use super::crc::{PIPE_CRC_CTL_A, PIPE_CRC_ENABLE, PIPE_CRC_RES_1_A};
    use crate::regs::display::PLANE_OFFSET_A;
    use vm_memory::Bytes;
    let mut v = lone_test_vgpu(1, 4 << 20);
    let base = map_aperture_pages(&mut v);
    let bytes: Vec<u8> = (0..8 * 4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    v.guest_memory()
        .write_slice(&bytes, vm_memory::GuestAddress(0x10_0000))
        .unwrap();
    v.mmio_write32(PLANE_SURF_A, base as u32).unwrap();
    v.mmio_write32(PLANE_STRIDE_A, 512 / 64).unwrap();
    v.mmio_write32(PLANE_SIZE_A, (19 << 16) | 99).unwrap();
    v.mmio_write32(PLANE_OFFSET_A, (2 << 16) | 5).unwrap();
    v.mmio_write32(PLANE_CTL_A, (1 << 31) | (4 << 24)).unwrap();
    v.mmio_write32(PIPE_CRC_CTL_A, PIPE_CRC_ENABLE).unwrap();
    v.mmio_write32(PIPECONF_A, PIPECONF_ENABLE).unwrap();
    let period = v.display().frame_period();
    v.display_tick(period);
    v.display_tick(2 * period);
    let frame = v.scan_out(0).unwrap();
    assert_eq!((frame.width, frame.height), (100, 20));
    let words: Vec<u32> = (0..5)
        .map(|i| v.mmio_read32(PIPE_CRC_RES_1_A + 4 * i).unwrap())
        .collect();
    assert_eq!(words, copied_then_hashed(&frame).to_vec());
}
