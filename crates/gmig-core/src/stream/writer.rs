//! Writing a stream.

use super::error::Result;
use super::error::StreamError;
use super::header::Gfn;
use super::header::StateKind;
use super::header::StreamHeader;
use super::hint::{encode, frame_ranges};
use super::pages::PageBatch;
use super::wire::WireEnd;
use super::wire::WireSection;
use super::wire::HEADER_LEN;
use super::wire::KIND_END;
use super::wire::KIND_PAGES;
use super::wire::KIND_SYNC;
use super::wire::SECTION_HEADER_LEN;
use super::wire::SECTION_VERSION;
use super::wire::{payload_crc, section_crc_with};
use super::wire::{KIND_WRITABLE_FRAMES, MAX_FRAME_RANGES_PER_SECTION};
use std::io;
use std::io::Write;
use zerocopy::little_endian::U16;
use zerocopy::little_endian::U32;
use zerocopy::little_endian::U64;
use zerocopy::IntoBytes;

/// Counts a writer or reader reports at the end of a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamSummary {
    /// Sections before END.
    pub sections: u64,
    /// Page records in all batches.
    pub pages: u64,
    /// Page records that were zero markers.
    pub zero_pages: u64,
    /// Bytes of the whole stream, END included.
    pub bytes: u64,
}

/// Writes a stream: the header on creation, then sections, then END on [`StreamWriter::finish`].
#[derive(Debug)]
pub struct StreamWriter<W: Write> {
    inner: W,
    crc: crc32fast::Hasher,
    summary: StreamSummary,
    states: Vec<StateKind>,
    /// From the header: guest frames and the format minor written.
    guest_pages: u64,
    format_minor: u16,
}

impl<W: Write> StreamWriter<W> {
    /// Write `header` to `inner` and return a writer for the sections.
    pub fn new(mut inner: W, header: &StreamHeader) -> Result<Self> {
        let bytes = header.to_bytes();
        inner.write_all(&bytes).map_err(|e| StreamError::Io {
            offset: 0,
            kind: e.kind(),
        })?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes);
        Ok(Self {
            inner,
            crc,
            summary: StreamSummary {
                bytes: HEADER_LEN as u64,
                ..StreamSummary::default()
            },
            states: Vec::new(),
            guest_pages: header.guest_pages,
            format_minor: header.format_minor,
        })
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.summary.bytes
    }

    /// The counts so far.
    pub fn summary(&self) -> StreamSummary {
        self.summary
    }

    /// The underlying writer (to flush it, or to read replies on a duplex connection).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    fn write_section(&mut self, kind: u16, payload: &[u8]) -> Result<()> {
        let offset = self.summary.bytes;
        let length = u32::try_from(payload.len()).map_err(|_| StreamError::SectionTooLarge {
            offset,
            kind,
            len: u32::MAX,
            max: u32::MAX,
        })?;
        let mut sec = WireSection {
            kind: U16::new(kind),
            version: U16::new(SECTION_VERSION),
            flags: U32::new(0),
            length: U32::new(length),
            crc: U32::new(0),
        };
        let body = payload_crc(payload);
        sec.crc = U32::new(section_crc_with(&sec.as_bytes()[..12], &body));
        let io = |e: io::Error| StreamError::Io {
            offset,
            kind: e.kind(),
        };
        self.inner.write_all(sec.as_bytes()).map_err(io)?;
        self.inner.write_all(payload).map_err(io)?;
        self.crc.update(sec.as_bytes());
        self.crc.combine(&body);
        self.summary.bytes += (SECTION_HEADER_LEN + payload.len()) as u64;
        Ok(())
    }

    /// Write one device-state section. Each kind may be written once; an update
    /// ([`StateKind::updates`]) only after the section it updates.
    pub fn write_state(&mut self, kind: StateKind, payload: &[u8]) -> Result<()> {
        if self.states.contains(&kind) {
            return Err(StreamError::DuplicateSection {
                offset: self.summary.bytes,
                kind: kind as u16,
            });
        }
        if let Some(needs) = kind.updates().filter(|k| !self.states.contains(k)) {
            return Err(StreamError::SectionOutOfOrder {
                offset: self.summary.bytes,
                kind: kind as u16,
                needs: needs as u16,
            });
        }
        self.write_section(kind as u16, payload)?;
        self.states.push(kind);
        self.summary.sections += 1;
        Ok(())
    }

    /// Write a switch-over marker with sequence number `seq` (format 1.1): the destination says
    /// when it has applied everything up to it.
    pub fn write_sync(&mut self, seq: u64) -> Result<()> {
        self.write_section(KIND_SYNC, &seq.to_le_bytes())?;
        self.summary.sections += 1;
        Ok(())
    }

    /// Write a writable-frames hint (format 1.2) naming `frames` (any order, repeats allowed), as
    /// sorted runs, in as many sections as it takes; nothing is written for no frames, nor into
    /// a stream whose header declares a format older than 1.2 (it cannot carry one). Every frame
    /// must lie below the header's `guest_pages`.
    pub fn write_writable_frames(&mut self, frames: &[Gfn]) -> Result<()> {
        if self.format_minor < 2 {
            return Ok(());
        }
        let ranges = frame_ranges(frames);
        if let Some(r) = ranges
            .last()
            .filter(|r| r.start.0.saturating_add(r.count) > self.guest_pages)
        {
            return Err(StreamError::PageOutOfRange {
                offset: self.summary.bytes,
                gfn: r.start.0.saturating_add(r.count - 1),
                pages: self.guest_pages,
            });
        }
        for part in ranges.chunks(MAX_FRAME_RANGES_PER_SECTION) {
            self.write_section(KIND_WRITABLE_FRAMES, &encode(part))?;
            self.summary.sections += 1;
        }
        Ok(())
    }

    /// Write a page batch (nothing is written for an empty batch).
    pub fn write_pages(&mut self, batch: &PageBatch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.write_section(KIND_PAGES, &batch.payload)?;
        self.summary.sections += 1;
        self.summary.pages += u64::from(batch.count);
        self.summary.zero_pages += u64::from(batch.zero);
        Ok(())
    }

    /// Flush the underlying writer.
    pub fn flush(&mut self) -> Result<()> {
        self.inner.flush().map_err(|e| StreamError::Io {
            offset: self.summary.bytes,
            kind: e.kind(),
        })
    }

    /// Write END (after checking every device-state section was written), flush, and return the
    /// writer and the stream's counts.
    pub fn finish(mut self) -> Result<(W, StreamSummary)> {
        if let Some(missing) = StateKind::ALL.iter().find(|k| !self.states.contains(k)) {
            return Err(StreamError::MissingSection {
                offset: self.summary.bytes,
                kind: *missing as u16,
            });
        }
        let end = WireEnd {
            sections: U64::new(self.summary.sections),
            pages: U64::new(self.summary.pages),
            stream_crc: U32::new(self.crc.clone().finalize()),
            reserved: U32::new(0),
        };
        self.write_section(KIND_END, end.as_bytes())?;
        self.flush()?;
        Ok((self.inner, self.summary))
    }
}
