//! Reading, writing and migrating a whole capture: the methods of [`AubCapture`] (the type is in
//! `model`).

use std::collections::BTreeMap;

use super::consts::{ctx, mmio_base, reg, DESCRIPTOR_LRCA_MASK, PAGE, PAGE_SIZE};
use super::error::{AubError, AubSpace, Result};
use super::model::{AubCapture, ReadLimits};
use super::reader::AubReader;
use super::submission::{submission_from_image, CaptureMemoryMut, RingState};
use super::writer::AubWriter;
use crate::{remap_walk, Budget, Engine, GgttOffset, RemapStats, SliceMove};

impl AubCapture {
    /// Read a whole capture with the default limits.
    ///
    /// # Errors
    /// The first [`AubError`].
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        Self::parse_with_limits(bytes, ReadLimits::default())
    }

    /// Read a whole capture with explicit limits.
    ///
    /// # Errors
    /// The first [`AubError`].
    pub fn parse_with_limits(bytes: &[u8], limits: ReadLimits) -> Result<Self> {
        let mut r = AubReader::with_limits(bytes, limits);
        while r.next_event()?.is_some() {}
        Ok(r.into_capture())
    }

    /// Write the capture as AUB bytes: version, registers, GGTT entries, physical pages (each trimmed
    /// after its last non-zero dword), then the submissions' execlist-port writes, each followed by a
    /// poll of `EXECLIST_STATUS` as `intel_dump_gpu` writes it.
    ///
    /// # Errors
    /// [`AubError::NoGeneration`] when `gen` is `None`.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let gen = self.gen.ok_or(AubError::NoGeneration)?;
        let mut w = AubWriter::new(gen, &self.app_name);
        for (&reg, &value) in &self.registers {
            w.register_write(reg, value);
        }
        // GGTT entries, in runs of consecutive indices.
        let entries: Vec<(u64, u64)> = self.memory.ggtt_entries().collect();
        let mut i = 0;
        while i < entries.len() {
            let start = entries[i].0;
            let mut run = Vec::new();
            while let Some(&(idx, pte)) = entries.get(i) {
                if idx != start + run.len() as u64 / 8 || run.len() >= PAGE {
                    break;
                }
                run.extend_from_slice(&pte.to_le_bytes());
                i += 1;
            }
            w.memory_write(AubSpace::GgttEntry, start * 8, &run);
        }
        for (page, data) in self.memory.phys_pages() {
            let used = data
                .chunks_exact(4)
                .rposition(|c| c != [0, 0, 0, 0])
                .map_or(4, |last| (last + 1) * 4);
            w.memory_write(AubSpace::Physical, page * PAGE_SIZE, &data[..used]);
        }
        for s in &self.submissions {
            w.submit(gen, s.engine, s.descriptor);
        }
        Ok(w.finish())
    }
}

impl AubCapture {
    /// The capture as it would be after migrating its vGPU from `mv.from` to `mv.to`:
    ///
    /// 1. every distinct (engine, ring, PPGTT) of the submissions is walked and its GGTT addresses
    ///    rebased in place ([`remap_walk`]: ring, first- and second-level batches; PPGTT addresses
    ///    untouched; each walk all or nothing);
    /// 2. each context image's `RING_START`, and each engine's `HWS_PGA` register, are rebased;
    /// 3. every GGTT entry inside a source slice moves to the same place in the destination slice
    ///    (the physical pages stay where they are);
    /// 4. each descriptor's LRCA is rebased, and the submissions are read again from the new image.
    ///
    /// Migrating with `mv.inverse()` afterwards gives back the original capture. The capture is
    /// taken as its final memory shows it: submissions that share a ring share its remap.
    ///
    /// # Errors
    /// [`AubError::Walk`] when a walk or its remap fails, [`AubError::NotInSlice`] for a context
    /// or ring outside the source slices, [`AubError::EntryCollision`]; `self` is never changed.
    pub fn migrate(&self, mv: &SliceMove, budget: Budget) -> Result<AubCapture> {
        let gen = self.gen.ok_or(AubError::NoGeneration)?;
        let mut out = self.clone();
        // 1. Commands.
        let mut done: Vec<(Engine, RingState, u64)> = Vec::new();
        for (i, s) in self.submissions.iter().enumerate() {
            let key = (s.engine, s.ring, s.pml4);
            if done.contains(&key) {
                continue;
            }
            done.push(key);
            let mut mem = CaptureMemoryMut {
                image: &mut out.memory,
                pml4: s.pml4,
            };
            let _stats: RemapStats = remap_walk(gen, s.engine, &mut mem, s.ring_span(), budget, mv)
                .map_err(|err| AubError::Walk { submission: i, err })?;
        }
        // 2. Context images and status pages.
        let rebase = |what: &'static str, addr: u64| {
            mv.rebase(GgttOffset(addr))
                .map(|g| g.0)
                .ok_or(AubError::NotInSlice { what, addr })
        };
        let mut contexts: Vec<u64> = self.submissions.iter().map(|s| s.lrca.0).collect();
        contexts.sort_unstable();
        contexts.dedup();
        for lrca in contexts {
            rebase("context", lrca)?;
            let at = GgttOffset(lrca + PAGE_SIZE + 4 * ctx::RING_START as u64);
            let old = out
                .memory
                .read_ggtt_dwords(at, 1)?
                .first()
                .copied()
                .unwrap_or(0);
            let start = u64::from(old) & 0xffff_f000;
            let new = rebase("ring", start)?;
            let new = u32::try_from(new).map_err(|_| AubError::NotInSlice {
                what: "ring",
                addr: start,
            })?;
            out.memory
                .write_ggtt(at, &((old & 0xfff) | new).to_le_bytes(), u64::MAX)?;
        }
        for engine in Engine::ALL {
            let reg = mmio_base(gen, engine) + reg::HWS_PGA;
            if let Some(v) = out.registers.get_mut(&reg) {
                if let Some(new) = mv.rebase(GgttOffset(u64::from(*v & 0xffff_f000))) {
                    *v = (*v & 0xfff) | u32::try_from(new.0).unwrap_or(*v & 0xffff_f000);
                }
            }
        }
        // 3. GGTT entries.
        let mut moved = BTreeMap::new();
        let mut kept = BTreeMap::new();
        for (index, pte) in out.memory.ggtt_entries() {
            match mv.rebase(GgttOffset(index * PAGE_SIZE)) {
                Some(to) => {
                    moved.insert(to.0 / PAGE_SIZE, pte);
                }
                None => {
                    kept.insert(index, pte);
                }
            }
        }
        for (&index, &pte) in &moved {
            if kept.insert(index, pte).is_some() {
                return Err(AubError::EntryCollision {
                    addr: index * PAGE_SIZE,
                });
            }
        }
        out.memory.ggtt = kept;
        // 4. Descriptors and submissions.
        for s in &mut out.submissions {
            let lrca = rebase("context", s.lrca.0)?;
            let descriptor = (s.descriptor & !DESCRIPTOR_LRCA_MASK) | lrca;
            *s = submission_from_image(&out.memory, s.engine, descriptor)?;
        }
        Ok(out)
    }
}
