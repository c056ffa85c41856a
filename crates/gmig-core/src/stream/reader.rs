//! Reading a stream: the shared validator, the pull reader, the push decoder and `load`.

use std::io;
use std::io::Read;

use zerocopy::FromBytes;

use super::error::{Result, StreamError};
use super::header::{Compatibility, StateKind, StreamHeader, StreamLimits};
use super::hint::FrameRange;
use super::pages::PageBatch;
use super::wire::{
    payload_crc, section_crc_with, WireEnd, WireSection, END_PAYLOAD_LEN, HEADER_LEN, KIND_END,
    KIND_PAGES, KIND_SYNC, KIND_WRITABLE_FRAMES, SECTION_HEADER_LEN, SECTION_VERSION,
    SYNC_PAYLOAD_LEN,
};
use super::writer::StreamSummary;

/// A section read and validated by a [`StreamReader`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Section {
    /// A device-state section: its kind and payload (opaque to the stream layer; the device
    /// validates its contents when it restores).
    State {
        /// Which part of the device state.
        kind: StateKind,
        /// The section's bytes.
        payload: Vec<u8>,
    },
    /// A page batch.
    Pages(PageBatch),
    /// A switch-over marker and its sequence number: the source waits until the destination says
    /// it has applied everything up to here (format 1.1).
    Sync(u64),
    /// Guest frames the device can write, as sorted disjoint runs (format 1.2): advisory, for a
    /// destination to back with memory before the stop.
    WritableFrames(Vec<FrameRange>),
    /// The END section: the stream is complete and consistent.
    End(StreamSummary),
}

/// The validation state shared by the pull ([`StreamReader`]) and push ([`StreamDecoder`])
/// readers: everything after the header.
#[derive(Debug, Clone)]
struct Validator {
    limits: StreamLimits,
    header: StreamHeader,
    offset: u64,
    crc: crc32fast::Hasher,
    summary: StreamSummary,
    states: Vec<StateKind>,
}

impl Validator {
    fn new(header: StreamHeader, header_bytes: &[u8], limits: StreamLimits) -> Self {
        let mut crc = crc32fast::Hasher::new();
        crc.update(header_bytes);
        Self {
            limits,
            header,
            offset: HEADER_LEN as u64,
            crc,
            summary: StreamSummary::default(),
            states: Vec::new(),
        }
    }

    /// Read a section header's fields at the current offset.
    fn parse_head(&self, head: &[u8; SECTION_HEADER_LEN]) -> Result<WireSection> {
        WireSection::read_from_bytes(head).map_err(|_| StreamError::Truncated {
            offset: self.offset,
            wanted: SECTION_HEADER_LEN as u64,
        })
    }

    /// Check a section header before its payload is read; returns the payload length.
    fn check_head(&self, head: &[u8; SECTION_HEADER_LEN]) -> Result<usize> {
        let at = self.offset;
        let sec = self.parse_head(head)?;
        let kind = sec.kind.get();
        let len = sec.length.get();
        // A writable-frames hint exists from format 1.2 on; an older stream cannot hold one.
        let hint = kind == KIND_WRITABLE_FRAMES && self.header.format_minor >= 2;
        // So does a display section from format 1.3 on.
        let display_too_new = kind == StateKind::Display as u16 && self.header.format_minor < 3;
        if display_too_new
            || (StateKind::from_wire(kind).is_none()
                && kind != KIND_PAGES
                && kind != KIND_END
                && kind != KIND_SYNC
                && !hint)
        {
            return Err(StreamError::UnknownSection { offset: at, kind });
        }
        if sec.version.get() != SECTION_VERSION {
            return Err(StreamError::UnsupportedSectionVersion {
                offset: at,
                kind,
                version: sec.version.get(),
            });
        }
        if sec.flags.get() != 0 {
            return Err(StreamError::SectionFlags {
                offset: at,
                flags: sec.flags.get(),
            });
        }
        if kind == KIND_SYNC && len != SYNC_PAYLOAD_LEN as u32 {
            return Err(StreamError::BadSectionLength {
                offset: at,
                kind,
                len,
                expected: SYNC_PAYLOAD_LEN as u32,
            });
        }
        let max = if kind == KIND_END {
            END_PAYLOAD_LEN as u32
        } else {
            self.limits.max_section_len
        };
        if len > max {
            return Err(StreamError::SectionTooLarge {
                offset: at,
                kind,
                len,
                max,
            });
        }
        if at + (SECTION_HEADER_LEN as u64) + u64::from(len) > self.limits.max_stream_bytes {
            return Err(StreamError::StreamTooLarge {
                offset: at,
                limit: self.limits.max_stream_bytes,
            });
        }
        Ok(len as usize)
    }

    /// Validate a complete section (its header already passed `check_head`).
    fn accept(&mut self, head: &[u8; SECTION_HEADER_LEN], payload: Vec<u8>) -> Result<Section> {
        let at = self.offset;
        let sec = self.parse_head(head)?;
        let kind = sec.kind.get();
        let body = payload_crc(&payload);
        let computed = section_crc_with(&head[..12], &body);
        if computed != sec.crc.get() {
            return Err(StreamError::SectionChecksum {
                offset: at,
                kind,
                stored: sec.crc.get(),
                computed,
            });
        }
        let stream_crc_before = self.crc.clone().finalize();
        self.crc.update(head);
        self.crc.combine(&body);
        let payload_at = at + SECTION_HEADER_LEN as u64;
        self.offset = payload_at + payload.len() as u64;

        if kind == KIND_END {
            return self.finish_end(at, &payload, stream_crc_before);
        }
        self.summary.sections += 1;
        if kind == KIND_WRITABLE_FRAMES {
            let ranges = super::hint::parse(&payload, self.header.guest_pages, payload_at)?;
            return Ok(Section::WritableFrames(ranges));
        }
        if kind == KIND_SYNC {
            let seq: [u8; SYNC_PAYLOAD_LEN] =
                payload
                    .as_slice()
                    .try_into()
                    .map_err(|_| StreamError::BadSectionLength {
                        offset: at,
                        kind,
                        len: payload.len() as u32,
                        expected: SYNC_PAYLOAD_LEN as u32,
                    })?;
            return Ok(Section::Sync(u64::from_le_bytes(seq)));
        }
        if let Some(kind) = StateKind::from_wire(kind) {
            if self.states.contains(&kind) {
                return Err(StreamError::DuplicateSection {
                    offset: at,
                    kind: kind as u16,
                });
            }
            if let Some(needs) = kind.updates().filter(|k| !self.states.contains(k)) {
                return Err(StreamError::SectionOutOfOrder {
                    offset: at,
                    kind: kind as u16,
                    needs: needs as u16,
                });
            }
            self.states.push(kind);
            return Ok(Section::State { kind, payload });
        }
        let batch = PageBatch::parse(payload, self.header.guest_pages, payload_at)?;
        self.summary.pages += u64::from(batch.count);
        self.summary.zero_pages += u64::from(batch.zero);
        Ok(Section::Pages(batch))
    }

    fn finish_end(&mut self, at: u64, payload: &[u8], stream_crc: u32) -> Result<Section> {
        let end = WireEnd::read_from_bytes(payload).map_err(|_| StreamError::BadControl {
            reason: "END payload has the wrong length",
            value: payload.len() as u64,
        })?;
        let checks = [
            ("section count", end.sections.get(), self.summary.sections),
            ("page count", end.pages.get(), self.summary.pages),
            (
                "stream checksum",
                u64::from(end.stream_crc.get()),
                u64::from(stream_crc),
            ),
            ("reserved word", u64::from(end.reserved.get()), 0),
        ];
        for (what, found, expected) in checks {
            if found != expected {
                return Err(StreamError::EndMismatch {
                    offset: at,
                    what,
                    found,
                    expected,
                });
            }
        }
        if let Some(missing) = StateKind::ALL.iter().find(|k| !self.states.contains(k)) {
            return Err(StreamError::MissingSection {
                offset: at,
                kind: *missing as u16,
            });
        }
        self.summary.bytes = self.offset;
        Ok(Section::End(self.summary))
    }
}

fn open_header(
    bytes: &[u8; HEADER_LEN],
    limits: &StreamLimits,
    expect: Option<&Compatibility>,
) -> Result<StreamHeader> {
    if limits.max_stream_bytes < HEADER_LEN as u64 {
        return Err(StreamError::StreamTooLarge {
            offset: 0,
            limit: limits.max_stream_bytes,
        });
    }
    let header = StreamHeader::parse(bytes, limits)?;
    if let Some(expect) = expect {
        header.check_compatible(expect)?;
    }
    Ok(header)
}

/// Reads a stream section by section, validating each completely before handing it out.
///
/// After an error, or after END, [`StreamReader::next_section`] returns `Ok(None)` for good.
#[derive(Debug)]
pub struct StreamReader<R: Read> {
    inner: R,
    v: Validator,
    done: bool,
}

pub(crate) fn read_exact_at<R: Read>(r: &mut R, buf: &mut [u8], offset: u64) -> Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(StreamError::Truncated {
                    offset,
                    wanted: (buf.len() - filled) as u64,
                })
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(StreamError::Io {
                    offset: offset + filled as u64,
                    kind: e.kind(),
                })
            }
        }
    }
    Ok(())
}

impl<R: Read> StreamReader<R> {
    /// Read and validate the header; with `expect`, refuse an incompatible generation or type.
    pub fn open(
        mut inner: R,
        limits: StreamLimits,
        expect: Option<&Compatibility>,
    ) -> Result<Self> {
        let mut bytes = [0u8; HEADER_LEN];
        read_exact_at(&mut inner, &mut bytes, 0)?;
        let header = open_header(&bytes, &limits, expect)?;
        Ok(Self {
            inner,
            v: Validator::new(header, &bytes, limits),
            done: false,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &StreamHeader {
        &self.v.header
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.v.offset
    }

    /// The underlying reader (to send replies on a duplex connection).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The next section, or `None` after END or after an error.
    pub fn next_section(&mut self) -> Result<Option<Section>> {
        if self.done {
            return Ok(None);
        }
        let result = self.read_section();
        // END and any error end the stream; every other section kind continues it.
        if matches!(result, Ok(Section::End(_)) | Err(_)) {
            self.done = true;
        }
        result.map(Some)
    }

    fn read_section(&mut self) -> Result<Section> {
        let at = self.v.offset;
        if at + SECTION_HEADER_LEN as u64 > self.v.limits.max_stream_bytes {
            return Err(StreamError::StreamTooLarge {
                offset: at,
                limit: self.v.limits.max_stream_bytes,
            });
        }
        let mut head = [0u8; SECTION_HEADER_LEN];
        read_exact_at(&mut self.inner, &mut head, at)?;
        let len = self.v.check_head(&head)?;
        // `len` is bounded by `max_section_len` in `check_head`, so this allocation is too.
        let mut payload = vec![0u8; len];
        read_exact_at(
            &mut self.inner,
            &mut payload,
            at + SECTION_HEADER_LEN as u64,
        )?;
        self.v.accept(&head, payload)
    }
}

/// A push-style reader: bytes arrive in any segmentation through [`StreamDecoder::feed`], and
/// each section comes out of [`StreamDecoder::next_section`] once complete and validated.
///
/// What it buffers is bounded by one section (header plus `max_section_len`); bytes after END,
/// or after an error, are refused.
#[derive(Debug)]
pub struct StreamDecoder {
    limits: StreamLimits,
    expect: Option<Compatibility>,
    buf: Vec<u8>,
    pos: usize,
    v: Option<Validator>,
    end: Option<StreamSummary>,
    failed: Option<StreamError>,
    fed: u64,
}

impl StreamDecoder {
    /// A decoder that will refuse a header incompatible with `expect`.
    pub fn new(limits: StreamLimits, expect: Option<Compatibility>) -> Self {
        Self {
            limits,
            expect,
            buf: Vec::new(),
            pos: 0,
            v: None,
            end: None,
            failed: None,
            fed: 0,
        }
    }

    /// The header, once its bytes have arrived and validated.
    pub fn header(&self) -> Option<&StreamHeader> {
        self.v.as_ref().map(|v| &v.header)
    }

    /// The END summary once the stream is complete.
    pub fn finished(&self) -> Option<StreamSummary> {
        self.end
    }

    /// Bytes fed so far.
    pub fn bytes_fed(&self) -> u64 {
        self.fed
    }

    fn fail(&mut self, e: StreamError) -> StreamError {
        self.failed = Some(e);
        self.buf = Vec::new();
        self.pos = 0;
        e
    }

    /// Accept more bytes. Fails after an earlier error, after END, or when the bytes buffered but
    /// not yet decoded would exceed one maximal section (call `next_section` until it returns
    /// `None` between feeds).
    pub fn feed(&mut self, data: &[u8]) -> Result<()> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.end.is_some() && !data.is_empty() {
            let offset = self.fed;
            let count = data.len() as u64;
            return Err(self.fail(StreamError::TrailingBytes { offset, count }));
        }
        if self.fed.saturating_add(data.len() as u64) > self.limits.max_stream_bytes {
            let offset = self.fed;
            let limit = self.limits.max_stream_bytes;
            return Err(self.fail(StreamError::StreamTooLarge { offset, limit }));
        }
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let cap = HEADER_LEN + SECTION_HEADER_LEN + self.limits.max_section_len as usize;
        if self.buf.len() - self.pos + data.len() > cap.saturating_mul(2) {
            let offset = self.fed;
            return Err(self.fail(StreamError::DecoderOverrun { offset }));
        }
        self.buf.extend_from_slice(data);
        self.fed += data.len() as u64;
        Ok(())
    }

    /// The next complete section, or `None` when more bytes are needed or END has been seen.
    pub fn next_section(&mut self) -> Result<Option<Section>> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.end.is_some() {
            return Ok(None);
        }
        let r = self.try_next();
        match r {
            Err(e) => Err(self.fail(e)),
            Ok(Some(Section::End(s))) => {
                self.end = Some(s);
                Ok(Some(Section::End(s)))
            }
            other => other,
        }
    }

    fn try_next(&mut self) -> Result<Option<Section>> {
        let avail = &self.buf[self.pos..];
        let Some(v) = self.v.as_mut() else {
            let Some(head) = avail.first_chunk::<HEADER_LEN>() else {
                return Ok(None);
            };
            let header = open_header(head, &self.limits, self.expect.as_ref())?;
            self.v = Some(Validator::new(header, head, self.limits));
            self.pos += HEADER_LEN;
            return self.try_next();
        };
        let Some(head) = avail.first_chunk::<SECTION_HEADER_LEN>() else {
            return Ok(None);
        };
        let head = *head;
        let len = v.check_head(&head)?;
        let Some(payload) = avail.get(SECTION_HEADER_LEN..SECTION_HEADER_LEN + len) else {
            return Ok(None);
        };
        let payload = payload.to_vec();
        self.pos += SECTION_HEADER_LEN + len;
        v.accept(&head, payload).map(Some)
    }
}

/// A whole stream read into memory and validated (for tests, tools and small streams).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedStream {
    /// The header.
    pub header: StreamHeader,
    /// Device-state sections by kind, in [`StateKind::ALL`] order.
    pub states: Vec<(StateKind, Vec<u8>)>,
    /// Page batches in stream order.
    pub batches: Vec<PageBatch>,
    /// Counts from END.
    pub summary: StreamSummary,
}

/// Read and validate a whole stream; nothing is returned unless every section and END check out.
pub fn load<R: Read>(
    inner: R,
    limits: StreamLimits,
    expect: Option<&Compatibility>,
) -> Result<LoadedStream> {
    let mut reader = StreamReader::open(inner, limits, expect)?;
    let mut states = Vec::new();
    let mut batches = Vec::new();
    loop {
        match reader.next_section()? {
            Some(Section::State { kind, payload }) => states.push((kind, payload)),
            Some(Section::Pages(b)) => batches.push(b),
            Some(Section::Sync(_) | Section::WritableFrames(_)) => {}
            Some(Section::End(summary)) => {
                states.sort_by_key(|(k, _)| *k);
                return Ok(LoadedStream {
                    header: reader.v.header,
                    states,
                    batches,
                    summary,
                });
            }
            None => {
                return Err(StreamError::Truncated {
                    offset: reader.v.offset,
                    wanted: SECTION_HEADER_LEN as u64,
                })
            }
        }
    }
}
