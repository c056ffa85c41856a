//! Test devices: a byte-blob device whose state changes while it runs, and a wrapper that
//! records every arc and fails on command.
//!
//! They are public so that other crates (the engine, the vfio-user bridge) can exercise their
//! migration paths without a GPU model, and so that the documentation has a complete, small
//! example of a [`MigrationDevice`].
//!
//! ## BlobDevice stream format
//! ```text
//! header  "GBLB" | version u16 = 1 | chunk_size u32 | blob_len u64        (little endian)
//! chunk   0x01 | index u32 | chunk bytes (chunk_size, shorter for the last chunk)
//! end     0xff | fnv1a-64 of the whole blob u64
//! ```
//! Pre-copy sends the header and every chunk, then re-sends chunks dirtied while running;
//! stop-copy sends what is still unsent or dirty, then `end`. A later record for a chunk
//! overrides an earlier one, so only the byte order of the stream matters.

use std::collections::VecDeque;

use crate::device::{
    ArcFailure, ArcResult, DeviceError, DirtyLogging, MigrationDevice, PrecopyInfo, Result,
    RunControl, StateLoader, StateSaver,
};
use crate::dma_log::DmaLogSlot;
use crate::dma_log::IovaRange;
use crate::state::{ArcKind, MigrationFeatures};

const MAGIC: &[u8; 4] = b"GBLB";
const VERSION: u16 = 1;
const HEADER_LEN: usize = 4 + 2 + 4 + 8;
const CHUNK_TAG: u8 = 0x01;
const END_TAG: u8 = 0xff;
const CHUNK_HDR: usize = 1 + 4;
const END_LEN: usize = 1 + 8;

/// FNV-1a, 64 bit: the blob device's end-of-stream check.
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exec {
    Running,
    Stopped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Session {
    Idle,
    PreCopy,
    StopCopy,
    Resuming,
}

/// A device whose whole state is a byte blob split in chunks. While running, [`BlobDevice::tick`]
/// rewrites pseudo-random bytes (like a GPU rewriting buffers every frame); pre-copy tracks the
/// chunks it dirties.
#[derive(Debug, Clone)]
pub struct BlobDevice {
    blob: Vec<u8>,
    chunk: usize,
    features: MigrationFeatures,
    exec: Exec,
    p2p_quiesced: bool,
    session: Session,
    dirty: Vec<bool>,
    out: VecDeque<u8>,
    /// Bytes of the initial pass still unread (pre-copy's `initial_bytes`).
    initial_left: u64,
    inbuf: Vec<u8>,
    max_stream: u64,
    rng: u64,
    dma: DmaLogSlot,
}

impl BlobDevice {
    /// A running device with `len` bytes of state derived from `seed`, in chunks of `chunk`
    /// bytes (at least 1), advertising `features`.
    pub fn new(len: usize, chunk: usize, seed: u64, features: MigrationFeatures) -> BlobDevice {
        let chunk = chunk.max(1);
        let mut d = BlobDevice {
            blob: vec![0; len],
            chunk,
            features,
            exec: Exec::Running,
            p2p_quiesced: false,
            session: Session::Idle,
            dirty: vec![false; len.div_ceil(chunk)],
            out: VecDeque::new(),
            initial_left: 0,
            inbuf: Vec::new(),
            max_stream: 0,
            rng: seed | 1,
            dma: DmaLogSlot::default(),
        };
        let mut blob = std::mem::take(&mut d.blob);
        for b in &mut blob {
            *b = d.next_rand() as u8;
        }
        d.blob = blob;
        d.max_stream = d.full_stream_len().saturating_mul(4).saturating_add(4096);
        d
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// The device state.
    pub fn blob(&self) -> &[u8] {
        &self.blob
    }

    /// Simulates the device writing guest RAM by DMA (logged when DMA logging is on).
    pub fn dma_write(&mut self, iova: u64, len: u64) {
        self.dma.mark_dirty(iova, len);
    }

    /// Whether the device is executing.
    pub fn is_running(&self) -> bool {
        self.exec == Exec::Running
    }

    /// Whether P2P DMA is quiesced.
    pub fn p2p_quiesced(&self) -> bool {
        self.p2p_quiesced
    }

    /// Runs the device for `writes` small writes (each rewriting up to 16 bytes of one chunk).
    /// A stopped device does nothing: its state is frozen. Returns whether it ran.
    pub fn tick(&mut self, writes: usize) -> bool {
        if self.exec != Exec::Running || self.blob.is_empty() {
            return false;
        }
        for _ in 0..writes {
            let r = self.next_rand();
            let len = self.blob.len() as u64;
            let at = (r % len) as usize;
            let n = ((r >> 40) % 16 + 1) as usize;
            let end = at.saturating_add(n).min(self.blob.len());
            let v = (r >> 32) as u8;
            if let Some(bytes) = self.blob.get_mut(at..end) {
                for b in bytes {
                    *b = b.wrapping_add(v) ^ 0x5a;
                }
            }
            if self.session == Session::PreCopy {
                for c in at / self.chunk..=(end.saturating_sub(1)) / self.chunk {
                    if let Some(d) = self.dirty.get_mut(c) {
                        *d = true;
                    }
                }
            }
        }
        true
    }

    fn chunk_len(&self, idx: usize) -> usize {
        let start = idx.saturating_mul(self.chunk);
        self.blob.len().saturating_sub(start).min(self.chunk)
    }

    fn chunk_record_len(&self, idx: usize) -> u64 {
        (CHUNK_HDR + self.chunk_len(idx)) as u64
    }

    fn full_stream_len(&self) -> u64 {
        let chunks: u64 = (0..self.dirty.len())
            .map(|i| self.chunk_record_len(i))
            .sum();
        (HEADER_LEN + END_LEN) as u64 + chunks
    }

    fn dirty_bytes(&self) -> u64 {
        self.dirty
            .iter()
            .enumerate()
            .filter(|(_, d)| **d)
            .map(|(i, _)| self.chunk_record_len(i))
            .sum()
    }

    fn push_header(&mut self) {
        self.out.extend(MAGIC);
        self.out.extend(VERSION.to_le_bytes());
        self.out.extend((self.chunk as u32).to_le_bytes());
        self.out.extend((self.blob.len() as u64).to_le_bytes());
    }

    fn push_chunk(&mut self, idx: usize) {
        let start = idx * self.chunk;
        let end = start + self.chunk_len(idx);
        self.out.push_back(CHUNK_TAG);
        self.out.extend((idx as u32).to_le_bytes());
        if let Some(bytes) = self.blob.get(start..end) {
            self.out.extend(bytes);
        }
    }

    fn push_dirty(&mut self) {
        for i in 0..self.dirty.len() {
            if self.dirty.get(i).copied().unwrap_or(false) {
                self.push_chunk(i);
                if let Some(d) = self.dirty.get_mut(i) {
                    *d = false;
                }
            }
        }
    }

    fn push_end(&mut self) {
        self.out.push_back(END_TAG);
        self.out.extend(fnv1a64(&self.blob).to_le_bytes());
    }

    fn begin_save(&mut self) {
        self.out.clear();
        self.push_header();
        for i in 0..self.dirty.len() {
            self.push_chunk(i);
        }
        self.dirty.iter_mut().for_each(|d| *d = false);
    }

    fn bad(offset: usize, reason: impl Into<String>) -> DeviceError {
        DeviceError::BadStream {
            offset: offset as u64,
            reason: reason.into(),
        }
    }

    /// Parses and checks a complete stream; returns the blob it describes.
    fn parse_stream(&self, s: &[u8]) -> Result<Vec<u8>> {
        let hdr = s
            .get(..HEADER_LEN)
            .ok_or_else(|| Self::bad(s.len(), "stream shorter than the header"))?;
        if hdr.get(..4) != Some(MAGIC.as_slice()) {
            return Err(Self::bad(0, "bad magic"));
        }
        let rd = |at: usize, n: usize| -> Result<&[u8]> {
            s.get(at..at.saturating_add(n))
                .ok_or_else(|| Self::bad(at, format!("truncated: need {n} bytes")))
        };
        let arr = |at: usize, n: usize| -> Result<[u8; 8]> {
            let mut a = [0u8; 8];
            let b = rd(at, n)?;
            if let Some(dst) = a.get_mut(..n) {
                dst.copy_from_slice(b);
            }
            Ok(a)
        };
        let u16_at = |at| arr(at, 2).map(|a| u16::from_le_bytes([a[0], a[1]]));
        let u32_at = |at| arr(at, 4).map(|a| u32::from_le_bytes([a[0], a[1], a[2], a[3]]));
        let u64_at = |at| arr(at, 8).map(u64::from_le_bytes);
        let version = u16_at(4)?;
        if version != VERSION {
            return Err(Self::bad(4, format!("unsupported version {version}")));
        }
        let chunk = u32_at(6)?;
        if chunk as usize != self.chunk {
            return Err(Self::bad(
                6,
                format!("chunk size {chunk}, device uses {}", self.chunk),
            ));
        }
        let len = u64_at(10)?;
        if len != self.blob.len() as u64 {
            return Err(Self::bad(
                10,
                format!("blob length 0x{len:x}, device has 0x{:x}", self.blob.len()),
            ));
        }
        let mut blob = vec![0u8; self.blob.len()];
        let mut seen = vec![false; self.dirty.len()];
        let mut at = HEADER_LEN;
        loop {
            let tag = *s
                .get(at)
                .ok_or_else(|| Self::bad(at, "missing end record"))?;
            match tag {
                CHUNK_TAG => {
                    let idx = u32_at(at + 1)? as usize;
                    if idx >= seen.len() {
                        return Err(Self::bad(at + 1, format!("chunk index {idx} out of range")));
                    }
                    let n = self.chunk_len(idx);
                    let data = rd(at + CHUNK_HDR, n)?;
                    let start = idx * self.chunk;
                    if let Some(dst) = blob.get_mut(start..start + n) {
                        dst.copy_from_slice(data);
                    }
                    if let Some(f) = seen.get_mut(idx) {
                        *f = true;
                    }
                    at += CHUNK_HDR + n;
                }
                END_TAG => {
                    let sum = u64_at(at + 1)?;
                    if at + END_LEN != s.len() {
                        return Err(Self::bad(at + END_LEN, "data after the end record"));
                    }
                    if let Some(missing) = seen.iter().position(|f| !f) {
                        return Err(Self::bad(at, format!("chunk {missing} never sent")));
                    }
                    if fnv1a64(&blob) != sum {
                        return Err(Self::bad(at + 1, format!("checksum mismatch 0x{sum:x}")));
                    }
                    return Ok(blob);
                }
                other => return Err(Self::bad(at, format!("unknown record tag 0x{other:x}"))),
            }
        }
    }
}

impl RunControl for BlobDevice {
    fn stop(&mut self) -> ArcResult {
        self.exec = Exec::Stopped;
        Ok(())
    }

    fn run(&mut self) -> ArcResult {
        self.exec = Exec::Running;
        Ok(())
    }

    fn quiesce_p2p(&mut self) -> ArcResult {
        if !self.features.contains(MigrationFeatures::P2P) {
            return Err(ArcFailure::rolled_back(DeviceError::NotSupported("P2P")));
        }
        self.p2p_quiesced = true;
        Ok(())
    }

    fn release_p2p(&mut self) -> ArcResult {
        if !self.features.contains(MigrationFeatures::P2P) {
            return Err(ArcFailure::rolled_back(DeviceError::NotSupported("P2P")));
        }
        self.p2p_quiesced = false;
        Ok(())
    }

    fn reset(&mut self) -> Result<()> {
        self.session = Session::Idle;
        self.out.clear();
        self.inbuf.clear();
        self.exec = Exec::Running;
        self.p2p_quiesced = false;
        Ok(())
    }
}

impl StateSaver for BlobDevice {
    fn start_stop_copy(&mut self) -> ArcResult {
        self.begin_save();
        self.push_end();
        self.session = Session::StopCopy;
        Ok(())
    }

    fn end_stop_copy(&mut self) -> ArcResult {
        self.out.clear();
        self.session = Session::Idle;
        Ok(())
    }

    fn save_read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.session == Session::PreCopy && self.out.is_empty() {
            self.push_dirty();
        }
        let n = buf.len().min(self.out.len());
        for (dst, src) in buf.iter_mut().zip(self.out.drain(..n)) {
            *dst = src;
        }
        self.initial_left = self.initial_left.saturating_sub(n as u64);
        Ok(n)
    }

    fn stop_copy_size(&mut self) -> Result<u64> {
        Ok(match self.session {
            Session::PreCopy => self.out.len() as u64 + self.dirty_bytes() + END_LEN as u64,
            Session::StopCopy => self.out.len() as u64,
            Session::Idle | Session::Resuming => self.full_stream_len(),
        })
    }

    fn start_precopy(&mut self) -> ArcResult {
        if !self.features.contains(MigrationFeatures::PRE_COPY) {
            return Err(ArcFailure::rolled_back(DeviceError::NotSupported(
                "pre-copy",
            )));
        }
        self.begin_save();
        self.initial_left = self.out.len() as u64;
        self.session = Session::PreCopy;
        Ok(())
    }

    fn abort_precopy(&mut self) -> ArcResult {
        self.out.clear();
        self.session = Session::Idle;
        self.initial_left = 0;
        Ok(())
    }

    fn precopy_to_stop_copy(&mut self) -> ArcResult {
        self.exec = Exec::Stopped;
        self.push_dirty();
        self.push_end();
        self.initial_left = 0;
        self.session = Session::StopCopy;
        Ok(())
    }

    fn precopy_info(&mut self) -> Result<PrecopyInfo> {
        let initial = self.initial_left;
        let queued_dirty = (self.out.len() as u64).saturating_sub(initial);
        Ok(PrecopyInfo {
            initial_bytes: initial,
            dirty_bytes: queued_dirty + self.dirty_bytes(),
        })
    }
}

impl StateLoader for BlobDevice {
    fn start_resuming(&mut self) -> ArcResult {
        self.inbuf.clear();
        self.session = Session::Resuming;
        Ok(())
    }

    fn resume_write(&mut self, data: &[u8]) -> Result<()> {
        let len = (self.inbuf.len() as u64).saturating_add(data.len() as u64);
        if len > self.max_stream {
            return Err(DeviceError::StreamTooLarge {
                len,
                max: self.max_stream,
            });
        }
        self.inbuf.extend_from_slice(data);
        Ok(())
    }

    fn finish_resuming(&mut self) -> ArcResult {
        match self.parse_stream(&self.inbuf) {
            Ok(blob) => {
                self.blob = blob;
                self.inbuf.clear();
                self.session = Session::Idle;
                Ok(())
            }
            Err(e) => Err(ArcFailure::rolled_back(e)),
        }
    }
}

impl DirtyLogging for BlobDevice {
    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> Result<u64> {
        Ok(self.dma.start(page_size, ranges)?)
    }
    fn dma_logging_stop(&mut self) -> Result<()> {
        Ok(self.dma.stop()?)
    }
    fn dma_logging_report(&mut self, iova: u64, length: u64, page_size: u64) -> Result<Vec<u64>> {
        Ok(self.dma.report(iova, length, page_size)?)
    }
}

impl MigrationDevice for BlobDevice {
    fn migration_features(&self) -> MigrationFeatures {
        self.features
    }
}

/// A wrapper that records every arc it is asked to run and fails on command.
#[derive(Debug, Clone)]
pub struct Faulty<D> {
    /// The wrapped device.
    pub inner: D,
    /// Every arc requested, in order (including failed ones).
    pub arcs: Vec<ArcKind>,
    fail: Vec<(ArcKind, bool)>,
    fail_reads: bool,
    fail_reset: bool,
}

impl<D> Faulty<D> {
    /// Wraps `inner`; nothing fails until asked.
    pub fn new(inner: D) -> Faulty<D> {
        Faulty {
            inner,
            arcs: Vec::new(),
            fail: Vec::new(),
            fail_reads: false,
            fail_reset: false,
        }
    }

    /// Makes the next `kind` arc fail, either rolled back or fatally. One-shot.
    pub fn fail_next(&mut self, kind: ArcKind, rolled_back: bool) {
        self.fail.push((kind, rolled_back));
    }

    /// Makes every saving read fail (until cleared).
    pub fn fail_reads(&mut self, on: bool) {
        self.fail_reads = on;
    }

    /// Makes the next reset fail. One-shot.
    pub fn fail_next_reset(&mut self) {
        self.fail_reset = true;
    }

    fn arc(&mut self, kind: ArcKind) -> ArcResult {
        self.arcs.push(kind);
        if let Some(i) = self.fail.iter().position(|(k, _)| *k == kind) {
            let (_, rolled_back) = self.fail.remove(i);
            let e = DeviceError::Failed(format!("injected failure of {kind:?}"));
            return Err(if rolled_back {
                ArcFailure::rolled_back(e)
            } else {
                ArcFailure::fatal(e)
            });
        }
        Ok(())
    }
}

impl<D: RunControl> RunControl for Faulty<D> {
    fn stop(&mut self) -> ArcResult {
        self.arc(ArcKind::Stop)?;
        self.inner.stop()
    }
    fn run(&mut self) -> ArcResult {
        self.arc(ArcKind::Run)?;
        self.inner.run()
    }
    fn quiesce_p2p(&mut self) -> ArcResult {
        self.arc(ArcKind::QuiesceP2p)?;
        self.inner.quiesce_p2p()
    }
    fn release_p2p(&mut self) -> ArcResult {
        self.arc(ArcKind::ResumeP2p)?;
        self.inner.release_p2p()
    }
    fn reset(&mut self) -> Result<()> {
        if std::mem::take(&mut self.fail_reset) {
            return Err(DeviceError::Failed("injected reset failure".into()));
        }
        self.inner.reset()
    }
}

impl<D: StateSaver> StateSaver for Faulty<D> {
    fn start_stop_copy(&mut self) -> ArcResult {
        self.arc(ArcKind::StartStopCopy)?;
        self.inner.start_stop_copy()
    }
    fn end_stop_copy(&mut self) -> ArcResult {
        self.arc(ArcKind::EndStopCopy)?;
        self.inner.end_stop_copy()
    }
    fn save_read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.fail_reads {
            return Err(DeviceError::Failed("injected read failure".into()));
        }
        self.inner.save_read(buf)
    }
    fn stop_copy_size(&mut self) -> Result<u64> {
        self.inner.stop_copy_size()
    }
    fn start_precopy(&mut self) -> ArcResult {
        self.arc(ArcKind::StartPreCopy)?;
        self.inner.start_precopy()
    }
    fn abort_precopy(&mut self) -> ArcResult {
        self.arc(ArcKind::AbortPreCopy)?;
        self.inner.abort_precopy()
    }
    fn precopy_to_stop_copy(&mut self) -> ArcResult {
        self.arc(ArcKind::PreCopyToStopCopy)?;
        self.inner.precopy_to_stop_copy()
    }
    fn precopy_info(&mut self) -> Result<PrecopyInfo> {
        self.inner.precopy_info()
    }
}

impl<D: StateLoader> StateLoader for Faulty<D> {
    fn start_resuming(&mut self) -> ArcResult {
        self.arc(ArcKind::StartResuming)?;
        self.inner.start_resuming()
    }
    fn resume_write(&mut self, data: &[u8]) -> Result<()> {
        self.inner.resume_write(data)
    }
    fn finish_resuming(&mut self) -> ArcResult {
        self.arc(ArcKind::FinishResuming)?;
        self.inner.finish_resuming()
    }
}

impl<D: DirtyLogging> DirtyLogging for Faulty<D> {
    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> Result<u64> {
        self.inner.dma_logging_start(page_size, ranges)
    }
    fn dma_logging_stop(&mut self) -> Result<()> {
        self.inner.dma_logging_stop()
    }
    fn dma_logging_report(&mut self, iova: u64, length: u64, page_size: u64) -> Result<Vec<u64>> {
        self.inner.dma_logging_report(iova, length, page_size)
    }
}

impl<D: MigrationDevice> MigrationDevice for Faulty<D> {
    fn migration_features(&self) -> MigrationFeatures {
        self.inner.migration_features()
    }
}
