//! Writing AUB files, and building captures from rings and batches.

use super::consts::{
    ctx, device_id, mmio_base, reg, subop, DESCRIPTOR_FLAGS, DESCRIPTOR_LRCA_MASK, GGTT_ENTRIES,
    OPCODE_MEM_TRACE, PAGE, PAGE_SIZE, PTE_ADDRESS_MASK, PTE_PRESENT, REGISTER_SIZE_DWORD,
    TYPE_AUB,
};
use super::error::{AubSpace, MemFault, Result};
use super::image::{bytes_of, check_range, MemoryImage};
use super::model::{AubCapture, ReadLimits};
use super::submission::{submission_from_image, Submission};
use crate::{Engine, Gen, GgttOffset};

// ------------------------------------------------------------------------------------------------
// Writer
// ------------------------------------------------------------------------------------------------

/// Low-level AUB packet writer.
#[derive(Clone, Debug)]
pub struct AubWriter {
    out: Vec<u8>,
}

pub(crate) fn header(sub: u32, total_dwords: usize) -> u32 {
    (TYPE_AUB << 29) | (OPCODE_MEM_TRACE << 23) | (sub << 16) | ((total_dwords as u32 - 1) & 0xffff)
}

/// Most data bytes one `MEMORY_WRITE` packet carries (a multiple of 8 and of the page size).
const MAX_WRITE: usize = 8 * PAGE;

impl AubWriter {
    /// Start a capture with its `MEM_TRACE_VERSION` packet.
    #[must_use]
    pub fn new(gen: Gen, app_name: &str) -> Self {
        let mut name: Vec<u8> = app_name.bytes().filter(|&b| b != 0).take(252).collect();
        name.push(0);
        while !name.len().is_multiple_of(4) {
            name.push(0);
        }
        let mut w = Self { out: Vec::new() };
        w.dword(header(subop::VERSION, 5 + name.len() / 4));
        w.dword(0); // file version
        w.dword(device_id(gen) << 8);
        w.dword(0);
        w.dword(0);
        w.out.extend_from_slice(&name);
        w
    }

    fn dword(&mut self, d: u32) {
        self.out.extend_from_slice(&d.to_le_bytes());
    }

    /// `MEMORY_WRITE` packets for `data` at `addr` (split into packets of at most 32 KiB).
    pub fn memory_write(&mut self, space: AubSpace, addr: u64, data: &[u8]) {
        let mut done = 0usize;
        loop {
            let n = (data.len() - done).min(MAX_WRITE);
            let chunk = &data[done..done + n];
            let a = addr + done as u64;
            self.dword(header(subop::MEMORY_WRITE, 5 + n.div_ceil(4)));
            self.dword(a as u32);
            self.dword((a >> 32) as u32);
            self.dword(space.dw3());
            self.dword(n as u32);
            self.out.extend_from_slice(chunk);
            self.out.resize(self.out.len() + (4 - n % 4) % 4, 0);
            done += n;
            if done >= data.len() {
                break;
            }
        }
    }

    /// A dword `REGISTER_WRITE`.
    pub fn register_write(&mut self, reg: u32, value: u32) {
        self.dword(header(subop::REGISTER_WRITE, 6));
        self.dword(reg);
        self.dword(REGISTER_SIZE_DWORD);
        self.dword(0xffff_ffff);
        self.dword(0);
        self.dword(value);
    }

    /// A dword `REGISTER_POLL`.
    pub fn register_poll(&mut self, reg: u32, mask: u32, value: u32) {
        self.dword(header(subop::REGISTER_POLL, 6));
        self.dword(reg);
        self.dword(REGISTER_SIZE_DWORD);
        self.dword(mask);
        self.dword(0);
        self.dword(value);
    }

    /// Submit a context: ELSP writes on GEN8/GEN9, ELSQ and control on GEN11, then a status poll.
    pub fn submit(&mut self, gen: Gen, engine: Engine, descriptor: u64) {
        let base = mmio_base(gen, engine);
        let (lo, hi) = (descriptor as u32, (descriptor >> 32) as u32);
        if gen == Gen::Gen11 {
            self.register_write(base + reg::EXECLIST_SQ_CONTENTS, lo);
            self.register_write(base + reg::EXECLIST_SQ_CONTENTS + 4, hi);
            self.register_write(base + reg::EXECLIST_CONTROL, 1);
            self.register_poll(base + reg::EXECLIST_STATUS, 1, 1);
        } else {
            self.register_write(base + reg::EXECLIST_SUBMITPORT, 0);
            self.register_write(base + reg::EXECLIST_SUBMITPORT, 0);
            self.register_write(base + reg::EXECLIST_SUBMITPORT, hi);
            self.register_write(base + reg::EXECLIST_SUBMITPORT, lo);
            self.register_poll(base + reg::EXECLIST_STATUS, 0x10, 0);
        }
    }

    /// The bytes written.
    #[must_use]
    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}

// ------------------------------------------------------------------------------------------------
// Builder
// ------------------------------------------------------------------------------------------------

/// Where a submission's ring and context live, and what the ring holds.
#[derive(Clone, Copy, Debug)]
pub struct RingSpec<'a> {
    /// GGTT offset of the ring buffer (page aligned).
    pub ring: GgttOffset,
    /// Ring size in bytes (a multiple of 4 KiB, at most 2 MiB).
    pub ring_size: u64,
    /// Commands placed at the start of the ring; head = 0, tail = their length (8-byte aligned).
    pub commands: &'a [u32],
    /// GGTT offset of the logical ring context (two pages: PPHWSP, then the context image).
    pub context: GgttOffset,
}

/// Builds captures from our own command sequences: maps GGTT and PPGTT pages onto freshly allocated
/// physical pages, places buffers, writes ring and context images, and submits.
#[derive(Clone, Debug)]
pub struct CaptureBuilder {
    capture: AubCapture,
    gen: Gen,
    next_phys_page: u64,
    pml4: Option<u64>,
    max_pages: u64,
}

/// First physical page the builder allocates.
const FIRST_PHYS_PAGE: u64 = 0x100;

impl CaptureBuilder {
    /// A new capture for `gen`, with execlists enabled (`GFX_MODE`) on every engine.
    #[must_use]
    pub fn new(gen: Gen, app_name: &str) -> Self {
        let mut capture = AubCapture {
            gen: Some(gen),
            app_name: app_name.chars().filter(|&c| c != '\0').take(200).collect(),
            ..AubCapture::default()
        };
        for engine in [
            Engine::Render,
            Engine::Blitter,
            Engine::Video,
            Engine::VideoEnhance,
        ] {
            capture
                .registers
                .insert(mmio_base(gen, engine) + reg::GFX_MODE, 0x8000_8000);
        }
        Self {
            capture,
            gen,
            next_phys_page: FIRST_PHYS_PAGE,
            pml4: None,
            max_pages: ReadLimits::default().max_pages,
        }
    }

    /// The generation.
    #[must_use]
    pub fn gen(&self) -> Gen {
        self.gen
    }

    /// The memory image so far.
    #[must_use]
    pub fn image(&self) -> &MemoryImage {
        &self.capture.memory
    }

    fn alloc_page(&mut self) -> std::result::Result<u64, MemFault> {
        if self.next_phys_page - FIRST_PHYS_PAGE >= self.max_pages {
            return Err(MemFault::PageLimit {
                limit: self.max_pages,
            });
        }
        let p = self.next_phys_page;
        self.next_phys_page += 1;
        Ok(p * PAGE_SIZE)
    }

    /// Map every GGTT page of `[addr, addr + len)` that is not mapped yet onto a new physical page.
    ///
    /// # Errors
    /// [`MemFault`] when the range leaves the GGTT or the page budget runs out.
    pub fn map_ggtt(&mut self, addr: GgttOffset, len: u64) -> Result<()> {
        let end = addr
            .0
            .checked_add(len)
            .ok_or(MemFault::Overflow { addr: addr.0, len })?;
        if end > GGTT_ENTRIES * PAGE_SIZE {
            return Err(MemFault::GgttOutOfRange { addr: end - 1 }.into());
        }
        let mut page = addr.0 / PAGE_SIZE;
        while page * PAGE_SIZE < end {
            if self
                .capture
                .memory
                .ggtt_entry(page)
                .is_none_or(|e| e & PTE_PRESENT == 0)
            {
                let pa = self.alloc_page()?;
                self.capture.memory.set_ggtt_entry(page, pa | PTE_PRESENT)?;
            }
            page += 1;
        }
        Ok(())
    }

    /// Write bytes through the GGTT, mapping pages first where needed.
    ///
    /// # Errors
    /// As [`CaptureBuilder::map_ggtt`].
    pub fn write_ggtt(&mut self, addr: GgttOffset, data: &[u8]) -> Result<()> {
        self.map_ggtt(addr, data.len() as u64)?;
        self.capture.memory.write_ggtt(addr, data, u64::MAX)?;
        Ok(())
    }

    /// Write dwords through the GGTT, mapping pages first where needed.
    ///
    /// # Errors
    /// As [`CaptureBuilder::map_ggtt`].
    pub fn write_ggtt_dwords(&mut self, addr: GgttOffset, dwords: &[u32]) -> Result<()> {
        self.write_ggtt(addr, &bytes_of(dwords))
    }

    /// Physical address of the PML4 of the capture's one PPGTT (allocated on first use).
    ///
    /// # Errors
    /// [`MemFault::PageLimit`].
    pub fn pml4(&mut self) -> Result<u64> {
        if let Some(p) = self.pml4 {
            return Ok(p);
        }
        let p = self.alloc_page()?;
        // Materialise the (empty) table so that it round-trips as a page of the image.
        self.capture.memory.write_phys(p, &[0; 8], u64::MAX)?;
        self.pml4 = Some(p);
        Ok(p)
    }

    /// Map every PPGTT page of `[addr, addr + len)` not mapped yet, creating tables as needed.
    ///
    /// # Errors
    /// [`MemFault`] when the range leaves the 48-bit space or the page budget runs out.
    pub fn map_ppgtt(&mut self, addr: u64, len: u64) -> Result<()> {
        check_range(addr, len)?;
        let pml4 = self.pml4()?;
        let mut page = addr / PAGE_SIZE;
        while page * PAGE_SIZE < addr + len {
            let va = page * PAGE_SIZE;
            let mut table = pml4;
            for level in (1u8..=4).rev() {
                let shift = 12 + 9 * u32::from(level - 1);
                let slot = table + ((va >> shift) & 0x1ff) * 8;
                let mut e = [0u8; 8];
                self.capture.memory.read_phys(slot, &mut e)?;
                let mut entry = u64::from_le_bytes(e);
                if entry & PTE_PRESENT == 0 {
                    let next = self.alloc_page()?;
                    if level > 1 {
                        self.capture.memory.write_phys(next, &[0; 8], u64::MAX)?;
                    }
                    entry = next | 3; // present | writable
                    self.capture
                        .memory
                        .write_phys(slot, &entry.to_le_bytes(), u64::MAX)?;
                }
                table = entry & PTE_ADDRESS_MASK;
            }
            page += 1;
        }
        Ok(())
    }

    /// Write bytes through the PPGTT, mapping pages first where needed.
    ///
    /// # Errors
    /// As [`CaptureBuilder::map_ppgtt`].
    pub fn write_ppgtt(&mut self, addr: u64, data: &[u8]) -> Result<()> {
        self.map_ppgtt(addr, data.len() as u64)?;
        let pml4 = self.pml4()?;
        self.capture
            .memory
            .write_ppgtt(pml4, addr, data, u64::MAX)?;
        Ok(())
    }

    /// Write dwords through the PPGTT, mapping pages first where needed.
    ///
    /// # Errors
    /// As [`CaptureBuilder::map_ppgtt`].
    pub fn write_ppgtt_dwords(&mut self, addr: u64, dwords: &[u32]) -> Result<()> {
        self.write_ppgtt(addr, &bytes_of(dwords))
    }

    /// Set a register's value (written before any submission).
    pub fn set_register(&mut self, reg: u32, value: u32) {
        self.capture.registers.insert(reg, value);
    }

    /// Place `spec.commands` in a ring, write a context image naming that ring and the PPGTT, and
    /// submit the context to `engine`.
    ///
    /// # Errors
    /// [`MemFault::BadContextAddress`] for a context the descriptor cannot hold, or a mapping fault.
    pub fn submit(&mut self, engine: Engine, spec: &RingSpec<'_>) -> Result<Submission> {
        let ctx_addr = spec.context.0;
        if !ctx_addr.is_multiple_of(PAGE_SIZE) || ctx_addr > DESCRIPTOR_LRCA_MASK {
            return Err(MemFault::BadContextAddress { addr: ctx_addr }.into());
        }
        let ring_size = spec.ring_size.clamp(PAGE_SIZE, 0x20_0000) & !(PAGE_SIZE - 1);
        self.map_ggtt(spec.ring, ring_size)?;
        self.write_ggtt_dwords(spec.ring, spec.commands)?;
        let tail = (spec.commands.len() as u64 * 4).next_multiple_of(8) % ring_size;
        let pml4 = self.pml4()?;
        let base = mmio_base(self.gen, engine);
        let mut image = vec![0u32; ctx::DWORDS];
        image[1] = 0x1100_1015; // MI_LOAD_REGISTER_IMM, 11 registers
        let pairs = [
            (2, reg::CTX_CTRL, 0x0009_0009),
            (ctx::RING_HEAD - 1, reg::RING_HEAD, 0),
            (ctx::RING_TAIL - 1, reg::RING_TAIL, tail as u32),
            (ctx::RING_START - 1, reg::RING_START, spec.ring.0 as u32),
            (
                ctx::RING_CTL - 1,
                reg::RING_CTL,
                ((ring_size - PAGE_SIZE) as u32 & 0x1f_f000) | 1,
            ),
        ];
        for (at, r, v) in pairs {
            image[at] = base + r;
            image[at + 1] = v;
        }
        image[0x21] = 0x1100_1011; // MI_LOAD_REGISTER_IMM, 9 registers
        image[0x22] = base + reg::CTX_TIMESTAMP;
        for (k, at) in (0x24..=0x32).step_by(2).enumerate() {
            // PDP3_UDW, PDP3_LDW, … PDP0_UDW, PDP0_LDW at 0x28c down to 0x270.
            image[at] = base + 0x28c - 4 * k as u32;
        }
        image[ctx::PDP0_UDW] = (pml4 >> 32) as u32;
        image[ctx::PDP0_LDW] = pml4 as u32;
        image[ctx::DWORDS - 1] = 0x0500_0000; // MI_BATCH_BUFFER_END
        self.map_ggtt(spec.context, 2 * PAGE_SIZE)?;
        self.write_ggtt_dwords(GgttOffset(ctx_addr + PAGE_SIZE), &image)?;
        let id = self.capture.submissions.len() as u64 + 1;
        let descriptor = (id << 32) | ctx_addr | DESCRIPTOR_FLAGS;
        let s = submission_from_image(&self.capture.memory, engine, descriptor)?;
        self.capture.submissions.push(s);
        Ok(s)
    }

    /// The finished capture.
    #[must_use]
    pub fn finish(self) -> AubCapture {
        self.capture
    }
}
