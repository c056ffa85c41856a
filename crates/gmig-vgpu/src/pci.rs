//! The vGPU as a PCI function: configuration space with an Intel integrated-GPU identity, the two
//! memory BARs a GVT-g vGPU exposes, and an MSI capability — what a VMM (in process) or a vfio-user
//! server (out of process) presents to the guest.
//!
//! | BAR | what | size |
//! |---|---|---|
//! | 0 (64-bit, non-prefetchable) | `GTTMMADR`: registers in the low 2 MiB, GGTT entries from 8 MiB | 16 MiB |
//! | 2 (64-bit, prefetchable) | `GMADR`: the aperture, GGTT offsets `0..aperture` seen by the CPU | the host's aperture |
//!
//! Configuration space follows PCI 3.0 type-0 rules: read-only identity, a command register with
//! memory decoding and bus mastering, BARs that answer the all-ones sizing probe, and an MSI
//! capability (64-bit address) at [`MSI_CAP`]. Accesses are 1, 2 or 4 bytes, naturally aligned;
//! anything else reads as zero and writes are ignored, as on real hardware.
//!
//! Like an Intel integrated GPU's (and a GVT-g vGPU's), it also has the graphics control word
//! `GMCH_CTRL` at [`GMCH_CTRL`] that i915 sizes the GGTT by (GGMS, bits 7:6: the GGTT entries
//! BAR0 holds, 8 MiB = a 4 GiB GGTT) and its stolen memory (GMS, bits 15:8: none — a vGPU has
//! no stolen memory, and i915 does not use it on a vGPU), and the base of stolen memory `BSM`
//! (0).

use gmig_cmdparser::Gen;

use crate::gtt::Space;
use crate::mmio;
use crate::vgpu::Vgpu;

/// Intel's PCI vendor id.
pub const VENDOR_INTEL: u16 = 0x8086;
/// Size of the configuration space this function implements (the conventional 256 bytes).
pub const CONFIG_SIZE: usize = 256;
/// BAR0 (`GTTMMADR`) size: 16 MiB.
pub const BAR0_SIZE: u64 = 16 << 20;
/// Offset of the MSI capability.
pub const MSI_CAP: usize = 0x90;
/// PCI command register bit: memory space decoding.
pub const CMD_MEMORY: u16 = 1 << 1;
/// PCI command register bit: bus master (DMA) enable.
pub const CMD_BUS_MASTER: u16 = 1 << 2;
/// PCI command register bit: INTx disable.
pub const CMD_INTX_DISABLE: u16 = 1 << 10;

/// `SNB_GMCH_CTRL`: the graphics control word (16 bits, read-only here).
pub const GMCH_CTRL: usize = 0x50;
/// `BSM`: base of stolen memory (read-only, 0: none).
pub const BSM: usize = 0x5c;

const COMMAND: usize = 0x04;
const STATUS: usize = 0x06;
const BAR0: usize = 0x10;
const BAR2: usize = 0x18;
const INTERRUPT_LINE: usize = 0x3c;
const MSI_CONTROL: usize = MSI_CAP + 2;
const MSI_ADDR_LO: usize = MSI_CAP + 4;
const MSI_ADDR_HI: usize = MSI_CAP + 8;
const MSI_DATA: usize = MSI_CAP + 12;
/// MSI message control: 64-bit address capable.
const MSI_64BIT: u16 = 1 << 7;
/// MSI message control: enable.
const MSI_ENABLE: u16 = 1;

/// The `GMCH_CTRL` word: GGMS (bits 7:6) encodes the size of the GGTT entries in BAR0,
/// `1 << GGMS` MiB (GEN8+), GMS (bits 15:8) no stolen memory.
pub fn gmch_ctrl() -> u16 {
    let gtt_mib = (mmio::MMIO_BAR_SIZE - mmio::GTT_MMIO_BASE) >> 20;
    (gtt_mib.trailing_zeros() as u16) << 6
}

/// The device id of an integrated GT2 part of each generation (Broadwell, Skylake, Ice Lake).
pub fn device_id(gen: Gen) -> u16 {
    match gen {
        Gen::Gen8 => 0x1616,
        Gen::Gen9 => 0x1912,
        Gen::Gen11 => 0x8a52,
    }
}

/// An MSI message the guest programmed: write `data` to `address` to interrupt it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsiMessage {
    /// The message address.
    pub address: u64,
    /// The message data.
    pub data: u32,
}

/// The vGPU's PCI configuration space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciConfig {
    bytes: [u8; CONFIG_SIZE],
    /// Sizes of BAR0 and BAR2 (powers of two).
    bar_sizes: [u64; 2],
}

impl PciConfig {
    /// Configuration space of a generation-`gen` vGPU whose aperture BAR spans `aperture_size`
    /// bytes (rounded up to a power of two, at least 4 KiB).
    pub fn new(gen: Gen, aperture_size: u64) -> Self {
        let mut c = PciConfig {
            bytes: [0; CONFIG_SIZE],
            bar_sizes: [BAR0_SIZE, aperture_size.max(4096).next_power_of_two()],
        };
        c.put16(0x00, VENDOR_INTEL);
        c.put16(0x02, device_id(gen));
        c.put16(STATUS, 1 << 4); // capabilities list
        c.bytes[0x08] = 0x07; // revision
        c.bytes[0x0b] = 0x03; // class: display controller, VGA compatible (0x0300, prog-if 0)
        c.put32(BAR0, 0b100); // 64-bit memory, non-prefetchable
        c.put32(BAR2, 0b1100); // 64-bit memory, prefetchable
        c.put16(0x2c, VENDOR_INTEL); // subsystem vendor
        c.put16(0x2e, device_id(gen)); // subsystem id
        c.bytes[0x34] = MSI_CAP as u8;
        c.bytes[0x3d] = 1; // INTA#
        c.bytes[MSI_CAP] = 0x05; // MSI capability id, last in the list
        c.put16(MSI_CONTROL, MSI_64BIT);
        c.put16(GMCH_CTRL, gmch_ctrl());
        c.put32(BSM, 0);
        c
    }

    fn get16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    fn put16(&mut self, at: usize, v: u16) {
        self.bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn get32(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.bytes[at..at + 4]);
        u32::from_le_bytes(b)
    }

    fn put32(&mut self, at: usize, v: u32) {
        self.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// The raw bytes (what a vfio-user REGION_READ of the config region returns).
    pub fn bytes(&self) -> &[u8; CONFIG_SIZE] {
        &self.bytes
    }

    /// Read `data.len()` bytes (1, 2 or 4, aligned) at `offset`; anything else reads as zeroes.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let Some(at) = access(offset, data.len()) {
            data.copy_from_slice(&self.bytes[at..at + data.len()]);
        }
    }

    /// Write `data` (1, 2 or 4 bytes, aligned) at `offset`. Only the command register, the BARs,
    /// the interrupt line and the MSI capability's writable fields change; the rest is read-only.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(at) = access(offset, data.len()) else {
            return;
        };
        for (i, &b) in data.iter().enumerate() {
            self.write_byte(at + i, b);
        }
    }

    fn write_byte(&mut self, at: usize, b: u8) {
        match at {
            COMMAND => {
                let keep = (CMD_MEMORY | CMD_BUS_MASTER) as u8 | 1;
                self.bytes[at] = b & keep;
            }
            0x05 => self.bytes[at] = b & (CMD_INTX_DISABLE >> 8) as u8,
            BAR0..=0x1f => {
                let (bar, base) = if at < BAR2 { (0, BAR0) } else { (1, BAR2) };
                let mut v = u64::from(self.get32(base)) | (u64::from(self.get32(base + 4)) << 32);
                let shift = 8 * (at - base);
                v = (v & !(0xff << shift)) | (u64::from(b) << shift);
                let flags = if bar == 0 { 0b100 } else { 0b1100 };
                let v = (v & !(self.bar_sizes[bar] - 1)) | flags;
                self.put32(base, v as u32);
                self.put32(base + 4, (v >> 32) as u32);
            }
            INTERRUPT_LINE => self.bytes[at] = b,
            MSI_CONTROL => self.bytes[at] = (self.bytes[at] & !1) | (b & 1),
            x if (MSI_ADDR_LO..MSI_ADDR_LO + 4).contains(&x) => {
                // Message addresses are dword aligned.
                self.bytes[at] = if x == MSI_ADDR_LO { b & !3 } else { b };
            }
            x if (MSI_ADDR_HI..MSI_DATA + 2).contains(&x) => self.bytes[at] = b,
            _ => {}
        }
    }

    /// The command register.
    pub fn command(&self) -> u16 {
        self.get16(COMMAND)
    }

    /// Size of BAR `index` (0 or 2), `None` for a BAR this function does not implement.
    pub fn bar_size(&self, index: usize) -> Option<u64> {
        match index {
            0 => Some(self.bar_sizes[0]),
            2 => Some(self.bar_sizes[1]),
            _ => None,
        }
    }

    /// The guest-physical base the guest programmed into BAR `index` (0 or 2), whether or not
    /// memory decoding is on.
    pub fn bar_base(&self, index: usize) -> Option<u64> {
        let at = match index {
            0 => BAR0,
            2 => BAR2,
            _ => return None,
        };
        let v = u64::from(self.get32(at)) | (u64::from(self.get32(at + 4)) << 32);
        Some(v & !0xf)
    }

    /// Which BAR, and at which offset in it, guest-physical address `gpa` falls in — only while
    /// memory decoding is on and for BARs the guest has placed (a base of zero is unplaced).
    pub fn decode(&self, gpa: u64) -> Option<(usize, u64)> {
        if self.command() & CMD_MEMORY == 0 {
            return None;
        }
        [0usize, 2].into_iter().find_map(|bar| {
            let base = self.bar_base(bar)?;
            let size = self.bar_size(bar)?;
            let off = gpa.checked_sub(base)?;
            (base != 0 && off < size).then_some((bar, off))
        })
    }

    /// The MSI message, when the guest enabled MSI.
    pub fn msi(&self) -> Option<MsiMessage> {
        if self.get16(MSI_CONTROL) & MSI_ENABLE == 0 {
            return None;
        }
        let address =
            u64::from(self.get32(MSI_ADDR_LO)) | (u64::from(self.get32(MSI_ADDR_HI)) << 32);
        Some(MsiMessage {
            address,
            data: u32::from(self.get16(MSI_DATA)),
        })
    }
}

/// A guest read of `data.len()` bytes at `offset` in BAR0 (registers and GGTT entries): 1-, 2-,
/// 4- and 8-byte naturally aligned accesses reach the registers (a 1- or 2-byte read returns
/// those bytes of the dword holding them: i915 reads the PV info version with a 2-byte read);
/// anything else, or a register the vGPU refuses, reads as zeroes.
pub fn bar0_read(vgpu: &Vgpu, offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Some(off) = reg_offset(offset, data.len()) else {
        return;
    };
    match data.len() {
        8 => {
            if let Ok(v) = vgpu.mmio_read64(off) {
                data.copy_from_slice(&v.to_le_bytes());
            }
        }
        n => {
            let dword = off & !3;
            if let Ok(v) = vgpu.mmio_read32(dword) {
                let at = (off - dword) as usize;
                data.copy_from_slice(&v.to_le_bytes()[at..at + n]);
            }
        }
    }
}

/// A guest write of `data` at `offset` in BAR0; accesses [`bar0_read`] would refuse are dropped,
/// as the hardware drops them. A 1- or 2-byte write changes only its bytes of the dword
/// (byte enables: [`Vgpu::mmio_write`]).
pub fn bar0_write(vgpu: &mut Vgpu, offset: u64, data: &[u8]) {
    let Some(off) = reg_offset(offset, data.len()) else {
        return;
    };
    let mut b = [0u8; 8];
    b[..data.len()].copy_from_slice(data);
    let _ = match data.len() {
        8 => vgpu.mmio_write64(off, u64::from_le_bytes(b)),
        4 => vgpu.mmio_write32(off, u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        n => {
            let dword = off & !3;
            let shift = 8 * (off - dword);
            let value = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) << shift;
            let enables = (u32::MAX >> (32 - 8 * n as u32)) << shift;
            vgpu.mmio_write(dword, value, enables)
        }
    };
}

fn reg_offset(offset: u64, len: usize) -> Option<u32> {
    let off = u32::try_from(offset).ok()?;
    (matches!(len, 1 | 2 | 4 | 8) && offset.is_multiple_of(len as u64) && off < mmio::MMIO_BAR_SIZE)
        .then_some(off)
}

/// A CPU read through the aperture (BAR2): GGTT offset `offset` in the guest's view, detiled
/// through a fence that covers it ([`crate::fence`]) and translated by the vGPU's GGTT to guest
/// memory. Unmapped or out-of-slice bytes read as zeroes.
pub fn aperture_read(vgpu: &Vgpu, offset: u64, data: &mut [u8]) {
    let view = vgpu.guest_gpu_view(None);
    let mut done = 0usize;
    for (addr, n) in vgpu.aperture_ranges(offset, data.len() as u64) {
        let part = &mut data[done..done + n as usize];
        if view.read(Space::Ggtt, addr, part).is_err() {
            part.fill(0);
        }
        done += n as usize;
    }
}

/// A CPU write through the aperture (BAR2), detiled as [`aperture_read`]; writes to unmapped
/// or out-of-slice offsets are dropped. Returns the guest frames written (the device wrote
/// them: they belong in DMA logging).
pub fn aperture_write(vgpu: &Vgpu, offset: u64, data: &[u8]) -> Vec<crate::gm::Gfn> {
    let view = vgpu.guest_gpu_view(None);
    let mut pages = Vec::new();
    let mut done = 0usize;
    for (addr, n) in vgpu.aperture_ranges(offset, data.len() as u64) {
        // A write that fails part-way (into an unmapped page) still wrote what came before:
        // those pages are reported too.
        let _ = view.write(
            Space::Ggtt,
            addr,
            &data[done..done + n as usize],
            &mut pages,
        );
        done += n as usize;
    }
    pages
}

/// The byte index of a 1-, 2- or 4-byte naturally aligned access inside the config space.
fn access(offset: u64, len: usize) -> Option<usize> {
    let at = usize::try_from(offset).ok()?;
    let aligned = matches!(len, 1 | 2 | 4) && at % len == 0;
    (aligned && at.checked_add(len)? <= CONFIG_SIZE).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r32(c: &PciConfig, off: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn w32(c: &mut PciConfig, off: u64, v: u32) {
        c.write(off, &v.to_le_bytes());
    }

    #[test]
    fn identity_is_an_intel_vga_controller_with_msi() {
        let c = PciConfig::new(Gen::Gen9, 1 << 30);
        assert_eq!(r32(&c, 0), 0x1912_8086);
        assert_eq!(r32(&c, 0x08) >> 8, 0x03_0000);
        assert_eq!(c.bytes()[0x34] as usize, MSI_CAP);
        assert_eq!(c.bytes()[MSI_CAP], 0x05);
        assert_eq!(c.msi(), None);
    }

    #[test]
    fn bars_answer_the_sizing_probe_and_keep_their_flags() {
        let mut c = PciConfig::new(Gen::Gen11, 256 << 20);
        for (bar, size, flags) in [(0usize, BAR0_SIZE, 0b100u32), (2, 256 << 20, 0b1100)] {
            let off = 0x10 + 4 * bar as u64;
            w32(&mut c, off, 0xffff_ffff);
            w32(&mut c, off + 4, 0xffff_ffff);
            let lo = r32(&c, off);
            let hi = r32(&c, off + 4);
            let mask = (u64::from(hi) << 32) | u64::from(lo & !0xf);
            assert_eq!(!mask + 1, size, "BAR{bar}");
            assert_eq!(lo & 0xf, flags, "BAR{bar}");
            let lo = if bar == 0 { 0xf000_0000 } else { 0xe000_0000 };
            w32(&mut c, off, lo);
            w32(&mut c, off + 4, 0x1);
            assert_eq!(c.bar_base(bar), Some(0x1_0000_0000 | u64::from(lo)));
        }
        assert_eq!(c.decode(0x1_e000_0010), None, "decoding is off");
        c.write(0x04, &(CMD_MEMORY | CMD_BUS_MASTER).to_le_bytes());
        assert_eq!(c.decode(0x1_e000_0010), Some((2, 0x10)));
        assert_eq!(c.decode(0x1_f000_0020), Some((0, 0x20)));
        assert_eq!(c.decode(0x1_f000_0000 + BAR0_SIZE), None);
        assert_eq!(c.decode(0x1_e000_0000 - 1), None);
    }

    #[test]
    fn identity_is_read_only_and_odd_accesses_are_ignored() {
        let mut c = PciConfig::new(Gen::Gen8, 1 << 30);
        let before = c.clone();
        w32(&mut c, 0x00, 0);
        w32(&mut c, 0x08, 0);
        c.write(0x01, &[0, 0]); // misaligned
        c.write(0xfe, &[0, 0, 0, 0]); // past the end
        c.write(0x10, &[0, 0, 0]); // odd length
        assert_eq!(c, before);
        let mut b = [0xaa; 2];
        c.read(0x03, &mut b);
        assert_eq!(b, [0, 0]);
    }

    #[test]
    fn msi_is_programmed_and_enabled_by_the_guest() {
        let mut c = PciConfig::new(Gen::Gen9, 1 << 30);
        w32(&mut c, (MSI_CAP + 4) as u64, 0xfee0_0003);
        w32(&mut c, (MSI_CAP + 8) as u64, 0);
        c.write((MSI_CAP + 12) as u64, &0x41u16.to_le_bytes());
        assert_eq!(c.msi(), None);
        c.write((MSI_CAP + 2) as u64, &1u16.to_le_bytes());
        assert_eq!(
            c.msi(),
            Some(MsiMessage {
                address: 0xfee0_0000,
                data: 0x41
            })
        );
        // The 64-bit capability bit is read-only.
        let mut b = [0u8; 2];
        c.read((MSI_CAP + 2) as u64, &mut b);
        assert_eq!(u16::from_le_bytes(b), MSI_64BIT | 1);
    }

    fn vgpu() -> Vgpu {
        use crate::gm::{HostConfig, PartitionManager, VgpuType};
        let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
        let (_, s) = pm.place(VgpuType::V5_8).unwrap();
        let mem = crate::gtt::new_guest_ram(4 << 20).unwrap();
        Vgpu::new(crate::vgpu::VgpuConfig::new(VgpuType::V5_8, 7), s, mem).unwrap()
    }

    #[test]
    fn bar0_reaches_registers_and_ggtt_entries_and_the_aperture_reaches_memory() {
        use vm_memory::{Bytes, GuestAddress};
        let mut v = vgpu();
        // The PV info magic through one 8-byte read.
        let mut m = [0u8; 8];
        bar0_read(&v, u64::from(mmio::VGT_PVINFO_PAGE), &mut m);
        assert_eq!(u64::from_le_bytes(m), mmio::VGT_MAGIC);
        // Map the first page of the guest's aperture slice to guest frame 3 through BAR0.
        let ap = v.guest_view().aperture.base.0;
        let entry = u64::from(mmio::GTT_MMIO_BASE) + ap / 4096 * 8;
        bar0_write(&mut v, entry, &((3u64 << 12) | 1).to_le_bytes());
        let mut e = [0u8; 8];
        bar0_read(&v, entry, &mut e);
        assert_eq!(u64::from_le_bytes(e), (3 << 12) | 1);
        // The CPU writes through the aperture land in guest frame 3.
        let pages = aperture_write(&v, ap + 16, b"gmig");
        assert_eq!(pages, vec![crate::gm::Gfn(3)]);
        let mut got = [0u8; 4];
        v.guest_memory()
            .read_slice(&mut got, GuestAddress(3 * 4096 + 16))
            .unwrap();
        assert_eq!(&got, b"gmig");
        let mut back = [0u8; 4];
        aperture_read(&v, ap + 16, &mut back);
        assert_eq!(&back, b"gmig");
        // Odd accesses and offsets outside the slice read as zero and write nothing.
        let mut odd = [0xffu8; 2];
        bar0_read(&v, u64::from(mmio::VGT_PVINFO_PAGE) + 1, &mut odd);
        assert_eq!(odd, [0, 0]);
        let mut odd = [0xffu8; 3];
        bar0_read(&v, u64::from(mmio::VGT_PVINFO_PAGE), &mut odd);
        assert_eq!(odd, [0, 0, 0]);
        assert!(aperture_write(&v, 0, b"x").is_empty());
        let mut z = [0xffu8; 4];
        aperture_read(&v, 0, &mut z);
        assert_eq!(z, [0; 4]);
    }

    #[test]
    fn gmch_control_sizes_the_ggtt_bar0_holds_and_no_stolen_memory() {
        let c = PciConfig::new(Gen::Gen9, 1 << 30);
        let mut w = [0u8; 2];
        c.read(GMCH_CTRL as u64, &mut w);
        let gmch = u16::from_le_bytes(w);
        // i915's gen8_get_total_gtt_size(): 1 << GGMS MiB of 8-byte entries, 4 KiB pages each.
        let ggms = (gmch >> 6) & 3;
        let entries = (1u64 << ggms << 20) / 8;
        assert_eq!(entries * 4096, 4 << 30, "a 4 GiB GGTT");
        assert_eq!(
            u64::from(mmio::GTT_MMIO_BASE) + entries * 8,
            BAR0_SIZE,
            "the entries end with BAR0"
        );
        assert_eq!(gmch >> 8, 0, "GMS: no stolen memory");
        assert_eq!(r32(&c, BSM as u64), 0);
        let mut c2 = c.clone();
        w32(&mut c2, GMCH_CTRL as u64, 0xffff_ffff);
        assert_eq!(c2, c, "read-only");
    }

    #[test]
    fn bar0_answers_one_and_two_byte_accesses_with_byte_enables() {
        let mut v = vgpu();
        // i915's intel_vgpu_detect(): readw of version_major, then version_minor.
        let pv = u64::from(mmio::VGT_PVINFO_PAGE);
        let mut w = [0u8; 2];
        bar0_read(&v, pv + 8, &mut w);
        assert_eq!(u16::from_le_bytes(w), mmio::VGT_VERSION_MAJOR);
        bar0_read(&v, pv + 10, &mut w);
        assert_eq!(u16::from_le_bytes(w), mmio::VGT_VERSION_MINOR);
        let mut b = [0u8; 1];
        bar0_read(&v, pv + 1, &mut b);
        assert_eq!(b[0], (mmio::VGT_MAGIC >> 8) as u8);
        // A plain register: only the bytes written change.
        let gpr = 0x2600u64;
        bar0_write(&mut v, gpr, &0x1122_3344u32.to_le_bytes());
        bar0_write(&mut v, gpr + 2, &0xaabbu16.to_le_bytes());
        bar0_write(&mut v, gpr, &[0x55]);
        assert_eq!(v.mmio_read32(0x2600).unwrap(), 0xaabb_3355);
        // A write-1-to-clear register: bytes not written clear nothing.
        let iir = u64::from(mmio::GT_IIR0);
        v.raise_engine_irq(crate::mmio::EngineId::Render, 0x101);
        v.raise_engine_irq(crate::mmio::EngineId::Blitter, 0x101);
        bar0_write(&mut v, iir + 2, &[0xff]);
        assert_eq!(v.mmio_read32(mmio::GT_IIR0).unwrap(), 0x0100_0101);
        // A masked register: the enables of a 2-byte write to the low half are not written.
        let mi_mode = 0x209cu64;
        bar0_write(&mut v, mi_mode, &0x0001u16.to_le_bytes());
        assert_eq!(v.mmio_read32(0x209c).unwrap(), 0);
        bar0_write(&mut v, mi_mode, &0x0001_0001u32.to_le_bytes());
        assert_eq!(v.mmio_read32(0x209c).unwrap(), 1);
        // GGTT entries take byte writes too.
        let ap = v.guest_view().aperture.base.0;
        let entry = u64::from(mmio::GTT_MMIO_BASE) + ap / 4096 * 8;
        bar0_write(&mut v, entry, &0x5001u16.to_le_bytes());
        let mut e = [0u8; 8];
        bar0_read(&v, entry, &mut e);
        assert_eq!(u64::from_le_bytes(e), 0x5001);
    }

    #[test]
    fn aperture_accesses_through_a_fence_are_detiled() {
        use vm_memory::{Bytes, GuestAddress};
        let mut v = vgpu();
        // Two aperture pages mapped to guest frames 8 and 9, X-tiled with a 1024-byte pitch
        // (two tiles across, 8 rows: gem_tiled_pread_basic's layout in small).
        let ap = v.guest_view().aperture.base.0;
        for p in 0..2u64 {
            let entry = u64::from(mmio::GTT_MMIO_BASE) + (ap / 4096 + p) * 8;
            bar0_write(&mut v, entry, &(((8 + p) << 12) | 1).to_le_bytes());
        }
        let fence = u64::from(mmio::FENCE_REG_BASE);
        bar0_write(&mut v, fence + 4, &((ap as u32 + 0x1000) | 7).to_le_bytes());
        bar0_write(&mut v, fence, &(ap as u32 | 1).to_le_bytes());
        // The CPU writes row r's first dword as r, linearly.
        for row in 0..8u64 {
            aperture_write(&v, ap + row * 1024, &(row as u32).to_le_bytes());
        }
        let ram = |at: u64| -> u32 { v.guest_memory().read_obj(GuestAddress(at)).unwrap() };
        for row in 0..8u64 {
            // In memory: tile 0 (frame 8) holds the left 512 bytes of each row, 512 apart.
            assert_eq!(ram(8 * 4096 + row * 512), row as u32, "row {row}");
        }
        // A write across a tile's edge splits: bytes 508..516 of row 0.
        let pages = aperture_write(&v, ap + 508, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(pages, vec![crate::gm::Gfn(8), crate::gm::Gfn(9)]);
        assert_eq!(ram(8 * 4096 + 508), u32::from_le_bytes([1, 2, 3, 4]));
        assert_eq!(ram(9 * 4096), u32::from_le_bytes([5, 6, 7, 8]));
        let mut back = [0u8; 8];
        aperture_read(&v, ap + 508, &mut back);
        assert_eq!(back, [1, 2, 3, 4, 5, 6, 7, 8]);
        // Without the fence the same offsets are memory as it is: offset 1024 is the third
        // 512-byte row of tile 0 (row 2's), not row 1.
        bar0_write(&mut v, fence, &(ap as u32).to_le_bytes());
        let mut linear = [0u8; 4];
        aperture_read(&v, ap + 1024, &mut linear);
        assert_eq!(u32::from_le_bytes(linear), 2);
    }

    #[test]
    fn an_aperture_write_into_an_unmapped_page_reports_what_it_wrote_before() {
        use vm_memory::{Bytes, GuestAddress};
        let mut v = vgpu();
        // The aperture's first page maps guest frame 16; the next page is unmapped.
        let ap = v.guest_view().aperture.base.0;
        let entry = u64::from(mmio::GTT_MMIO_BASE) + ap / 4096 * 8;
        bar0_write(&mut v, entry, &((16u64 << 12) | 1).to_le_bytes());
        let pages = aperture_write(&v, ap + 0xffe, &[0xaa; 4]);
        let got: u16 = v
            .guest_memory()
            .read_obj(GuestAddress(16 * 4096 + 0xffe))
            .unwrap();
        assert_eq!(got, 0xaaaa, "the bytes before the unmapped page landed");
        assert_eq!(
            pages,
            vec![crate::gm::Gfn(16)],
            "and their page is reported"
        );
    }
}
