//! The decoder: zero-copy, lazy and total over a slice of little-endian dwords.
//!
//! Gimli style: [`Decoder::next`] returns `Result<Option<Decoded>>`; after the first error the
//! decoder is empty for good. Errors are small, `Copy`, and name the dword offset and the value.

use thiserror::Error;

use crate::addr::AddressSpace;
use crate::table::{
    self, Access, AddrField, CommandDesc, Cond, Engine, Gen, Hook, SizeRule, StatusPage, Width,
};

/// Why a command buffer could not be decoded.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// No table row matches DW0 on this generation and engine.
    #[error("dword {offset}: unknown opcode, DW0 0x{dw0:08x}")]
    UnknownOpcode {
        /// Dword offset of DW0.
        offset: usize,
        /// The offending DW0.
        dw0: u32,
    },
    /// The length field gives a length the command cannot have.
    #[error("dword {offset}: {name} has bad length {len} (DW0 0x{dw0:08x})")]
    BadLength {
        /// Dword offset of DW0.
        offset: usize,
        /// The command.
        name: &'static str,
        /// DW0.
        dw0: u32,
        /// Length in dwords that DW0 gives.
        len: usize,
    },
    /// The command runs past the end of the buffer.
    #[error("dword {offset}: {name} needs {len} dwords, only {available} left")]
    Truncated {
        /// Dword offset of DW0.
        offset: usize,
        /// The command.
        name: &'static str,
        /// Length in dwords.
        len: usize,
        /// Dwords left in the buffer.
        available: usize,
    },
}

impl DecodeError {
    /// Dword offset of the command the error is about.
    pub fn offset(&self) -> usize {
        match *self {
            DecodeError::UnknownOpcode { offset, .. }
            | DecodeError::BadLength { offset, .. }
            | DecodeError::Truncated { offset, .. } => offset,
        }
    }

    /// The same error with its offset moved by `base` dwords (saturating).
    pub fn rebased(self, base: usize) -> Self {
        let mut e = self;
        match &mut e {
            DecodeError::UnknownOpcode { offset, .. }
            | DecodeError::BadLength { offset, .. }
            | DecodeError::Truncated { offset, .. } => *offset = offset.saturating_add(base),
        }
        e
    }
}

/// Where a command buffer sits in the ring → batch nesting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum BatchLevel {
    /// The ring buffer itself (or a context's indirect/workaround buffer).
    Ring,
    /// A first-level batch buffer started from the ring.
    First,
    /// A second-level batch buffer called from a first-level batch.
    Second,
}

/// What a decoded command needs to know about the buffer it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct BatchContext {
    /// Nesting level.
    pub level: BatchLevel,
    /// Whether the buffer is privileged: the ring, or a batch started from a privileged buffer
    /// through the GGTT. Privileged buffers address memory through the GGTT unless a command
    /// selects the PPGTT; unprivileged ones through the PPGTT, and may not select the GGTT.
    pub privileged: bool,
}

impl BatchContext {
    /// The ring buffer (privileged).
    pub const RING: BatchContext = BatchContext {
        level: BatchLevel::Ring,
        privileged: true,
    };

    /// A batch at `level` fetched through `space`, started from a buffer of context `parent`.
    pub fn batch(level: BatchLevel, space: AddressSpace, parent: BatchContext) -> BatchContext {
        BatchContext {
            level,
            privileged: parent.privileged && space == AddressSpace::Ggtt,
        }
    }

    /// A first-level batch fetched through `space` from the ring.
    pub fn first_level(space: AddressSpace) -> BatchContext {
        Self::batch(BatchLevel::First, space, Self::RING)
    }

    /// The space of address fields without a selector bit.
    pub fn implicit_space(&self) -> AddressSpace {
        if self.privileged {
            AddressSpace::Ggtt
        } else {
            AddressSpace::Ppgtt
        }
    }
}

/// One graphics address a command uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct AddressUse {
    /// Field name in the table (`"dst"`, `"post_sync"` …).
    pub name: &'static str,
    /// Dword index of the (low) address dword within the command.
    pub dword: usize,
    /// Translation it goes through.
    pub space: AddressSpace,
    /// The address the field holds (bits below the field's lowest bit cleared).
    pub addr: u64,
    /// Read, write or both.
    pub access: Access,
    /// First byte of the range the command touches through it (may differ from `addr`, e.g. a
    /// blit's rectangle).
    pub start: u64,
    /// Bytes touched from `start` (`1` when `bounded` is false; `0` for an empty blit;
    /// [`INVALID_LEN`] when the command's range does not fit the address space, which the audit
    /// refuses and write sets treat as unknown).
    pub len: u64,
    /// Whether `len` is a real bound (false: only `start` is known).
    pub bounded: bool,
    /// Width of the field.
    pub width: Width,
    /// Lowest address bit of the field (bits below it belong to other fields).
    pub lo: u8,
}

/// One decoded command, borrowing its dwords from the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    /// Generation it was decoded for.
    pub gen: Gen,
    /// Engine it was decoded for.
    pub engine: Engine,
    /// Dword offset of DW0 within the decoded buffer.
    pub offset: usize,
    /// Its table row.
    pub desc: &'static CommandDesc,
    /// The whole command, DW0 included.
    pub dwords: &'a [u32],
}

impl<'a> Decoded<'a> {
    /// DW0.
    pub fn dw0(&self) -> u32 {
        self.dwords.first().copied().unwrap_or(0)
    }

    /// Dword `i` of the command (DW0 is 0), if the command is that long.
    pub fn dword(&self, i: usize) -> Option<u32> {
        self.dwords.get(i).copied()
    }

    /// Length in dwords.
    pub fn len(&self) -> usize {
        self.dwords.len()
    }

    /// Always false: a command has at least DW0.
    pub fn is_empty(&self) -> bool {
        self.dwords.is_empty()
    }

    /// The graphics addresses the command uses, in table order.
    pub fn addresses(&self, ctx: &BatchContext) -> AddressIter<'a> {
        AddressIter {
            dwords: self.dwords,
            fields: self.desc.addrs,
            field: 0,
            element: 0,
            implicit: ctx.implicit_space(),
        }
    }

    /// For MI_BATCH_BUFFER_START: whether it calls a second-level batch (DW0 bit 22).
    pub fn is_second_level_call(&self) -> bool {
        self.desc.hook == Hook::BatchStart && (self.dw0() >> 22) & 1 == 1
    }
}

/// Iterator over a command's [`AddressUse`]s (see [`Decoded::addresses`]).
#[derive(Clone, Debug)]
pub struct AddressIter<'a> {
    dwords: &'a [u32],
    fields: &'static [AddrField],
    field: usize,
    element: usize,
    implicit: AddressSpace,
}

impl Iterator for AddressIter<'_> {
    type Item = AddressUse;

    #[inline]
    fn next(&mut self) -> Option<AddressUse> {
        loop {
            let f = self.fields.get(self.field)?;
            let stride = f.repeat.map_or(0, usize::from);
            let base = self.element.checked_mul(stride)?;
            let at = base.checked_add(usize::from(f.dword))?;
            let fits = at
                .checked_add(f.width.dwords())
                .is_some_and(|end| end <= self.dwords.len());
            if stride == 0 || !fits {
                // Single field, or past the last element: move to the next field.
                self.field += 1;
                self.element = 0;
                if stride != 0 || !fits {
                    continue;
                }
            } else {
                self.element += 1;
            }
            if cond_holds(f.cond, self.dwords, base) {
                return Some(address_use(f, self.dwords, at, base, self.implicit));
            }
        }
    }
}

#[inline]
fn dword_at(dwords: &[u32], i: usize) -> u32 {
    dwords.get(i).copied().unwrap_or(0)
}

#[inline]
fn bits(v: u32, lo: u8, n: u8) -> u32 {
    let shifted = v.checked_shr(u32::from(lo)).unwrap_or(0);
    if n >= 32 {
        shifted
    } else {
        shifted & ((1u32 << n) - 1)
    }
}

#[inline]
fn cond_holds(c: Cond, dwords: &[u32], base: usize) -> bool {
    let at = |dword: u8| dword_at(dwords, base.saturating_add(usize::from(dword)));
    match c {
        Cond::Always => true,
        Cond::NonZero { dword, lo, bits: n } => bits(at(dword), lo, n) != 0,
        Cond::BitSet { dword, bit } => bits(at(dword), bit, 1) != 0,
        Cond::BitClear { dword, bit } => bits(at(dword), bit, 1) == 0,
        Cond::All(all) => all.iter().all(|c| cond_holds(*c, dwords, base)),
    }
}

/// A store-data-index write (see [`IndexRule`](crate::table::IndexRule)): which status page,
/// the byte offset the command names and how many bytes it writes there. `offset + len` may
/// exceed the page: the audit refuses such a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexUse {
    /// The context's per-process status page (else the engine's global one).
    pub per_process: bool,
    /// Byte offset into the page (the command's dword with the bits below the rule's `lo`
    /// cleared).
    pub offset: u64,
    /// Bytes written.
    pub len: u64,
}

impl Decoded<'_> {
    /// The command's store-data-index write, if its row has one and the command makes it.
    pub fn status_index(&self) -> Option<IndexUse> {
        let Hook::StatusIndex(rule) = self.desc.hook else {
            return None;
        };
        if !cond_holds(rule.when, self.dwords, 0) {
            return None;
        }
        let per_process = match rule.page {
            StatusPage::PerProcess => true,
            StatusPage::PerProcessIfBit { dword, bit } => {
                bits(dword_at(self.dwords, usize::from(dword)), bit, 1) != 0
            }
        };
        let offset = u64::from(bits(
            dword_at(self.dwords, usize::from(rule.dword)),
            rule.lo,
            32 - rule.lo,
        )) << rule.lo;
        let len = range_of(rule.size, self.dwords, 0, offset).map_or(INVALID_LEN, |(_, l)| l);
        Some(IndexUse {
            per_process,
            offset,
            len,
        })
    }
}

/// `AddressUse::len` of a range that does not fit the address space (see [`AddressUse`]).
pub const INVALID_LEN: u64 = u64::MAX;

/// Raw little-endian value of an address field at dword `at`.
#[inline]
pub(crate) fn field_raw(width: Width, dwords: &[u32], at: usize) -> u64 {
    let lo = u64::from(dword_at(dwords, at));
    match width {
        Width::A32 => lo,
        Width::A48 | Width::A64 => lo | (u64::from(dword_at(dwords, at.saturating_add(1))) << 32),
    }
}

#[inline]
fn address_use(
    f: &AddrField,
    dwords: &[u32],
    at: usize,
    base: usize,
    implicit: AddressSpace,
) -> AddressUse {
    let addr = field_raw(f.width, dwords, at) & f.mask();
    let space = table::resolve_space(f.space, dwords, implicit);
    let (start, len, bounded) = match f.size {
        SizeRule::Unknown => (addr, 1, false),
        rule => match range_of(rule, dwords, base, addr) {
            Some((s, l)) => (s, l, true),
            // The size rule applies but its range does not fit the 64-bit address space (a huge
            // negative pitch, an overflowing size): an invalid range that no audit passes and no
            // write set bounds.
            None => (addr, INVALID_LEN, true),
        },
    };
    AddressUse {
        name: f.name,
        dword: at,
        space,
        addr,
        access: f.access,
        start,
        len,
        bounded,
        width: f.width,
        lo: f.lo,
    }
}

/// Blit surface geometry: `pitch` bytes per row (signed), `cpp` bytes per pixel, and the row
/// granularity of the tiling (1 for linear).
#[derive(Clone, Copy)]
struct Surface {
    pitch: i64,
    cpp: u64,
    tile_rows: u32,
}

/// Touched byte range from `base` for corners `(x1,y1)`–`(x2,y2)` (exclusive) of surface `s`.
/// Empty rectangles touch nothing: `Some((base, 0))`.
/// The bytes a blit touches: a `w`×`h` rectangle (from the destination corners `x1,y1`–`x2,y2`)
/// placed at `addr` (source corner `sx,sy`) on a surface whose DW pitch field is `pitch_raw`: a signed 16-bit byte count
/// when linear, a dword count when tiled (`tile_rows` rows per tile; `None`: linear).
fn blit_range(
    addr: u64,
    pitch_raw: u32,
    tile_rows: Option<u32>,
    cpp: u64,
    (x1, y1, x2, y2): (u32, u32, u32, u32),
    (sx, sy): (u32, u32),
) -> Option<(u64, u64)> {
    let mut pitch = i64::from(i16::from_le_bytes((pitch_raw as u16).to_le_bytes()));
    if tile_rows.is_some() {
        pitch = pitch.abs().checked_mul(4)?;
    }
    let w = x2.saturating_sub(x1);
    let h = y2.saturating_sub(y1);
    rect_range(
        addr,
        (sx, sy, sx.checked_add(w)?, sy.checked_add(h)?),
        Surface {
            pitch,
            cpp,
            tile_rows: tile_rows.unwrap_or(1),
        },
    )
}

fn rect_range(base: u64, (x1, y1, x2, y2): (u32, u32, u32, u32), s: Surface) -> Option<(u64, u64)> {
    let Surface {
        pitch,
        cpp,
        tile_rows,
    } = s;
    if x2 <= x1 || y2 <= y1 {
        return Some((base, 0));
    }
    let (y1, y2) = if tile_rows > 1 {
        (
            y1 / tile_rows * tile_rows,
            y2.div_ceil(tile_rows).checked_mul(tile_rows)?,
        )
    } else {
        (y1, y2)
    };
    let (first_col, end_col) = if tile_rows > 1 {
        // A tiled row of tiles spans the whole pitch; columns past the pitch reach into the
        // tiles after it, up to one 4 KiB tile per 128 bytes of row (Y tiles; X tiles are wider).
        let row = i64::from(x2).checked_mul(i64::try_from(cpp).ok()?)?;
        let end = if row <= pitch.abs() {
            pitch.abs()
        } else {
            row.checked_add(127)?.checked_div(128)?.checked_mul(4096)?
        };
        (0i64, end.max(pitch.abs()))
    } else {
        (
            i64::from(x1).checked_mul(i64::try_from(cpp).ok()?)?,
            i64::from(x2).checked_mul(i64::try_from(cpp).ok()?)?,
        )
    };
    let row_a = i64::from(y1).checked_mul(pitch)?;
    let row_b = i64::from(y2 - 1).checked_mul(pitch)?;
    let lo = row_a.min(row_b).checked_add(first_col)?;
    let hi = row_a.max(row_b).checked_add(end_col)?;
    let len = u64::try_from(hi.checked_sub(lo)?).ok()?;
    let start = if lo >= 0 {
        base.checked_add(u64::try_from(lo).ok()?)?
    } else {
        base.checked_sub(lo.unsigned_abs())?
    };
    Some((start, len))
}

fn xy(v: u32) -> (u32, u32) {
    (v & 0xffff, v >> 16)
}

/// The byte range `[start, start+len)` the size rule gives, or `None` when it does not fit the
/// address space (or the rule is `Unknown`, which the caller handles first).
#[inline]
fn range_of(rule: SizeRule, dwords: &[u32], base: usize, addr: u64) -> Option<(u64, u64)> {
    let d = |i: usize| dword_at(dwords, i);
    let r = match rule {
        SizeRule::Unknown => None,
        SizeRule::Fixed(n) => Some((addr, u64::from(n))),
        SizeRule::TrailingDwords { first } => {
            let n = dwords.len().checked_sub(usize::from(first))?;
            Some((addr, u64::try_from(n).ok()?.checked_mul(4)?))
        }
        SizeRule::Field {
            dword,
            lo,
            bits: n,
            scale,
            add,
        } => {
            let v = u64::from(bits(d(base.saturating_add(usize::from(dword))), lo, n));
            let len = v
                .checked_mul(u64::from(scale))?
                .checked_add(u64::from(add))?;
            Some((addr, len))
        }
        SizeRule::XyDst | SizeRule::XySrc => {
            let br13 = d(1);
            let cpp = match (br13 >> 24) & 3 {
                0 => 1,
                1 | 2 => 2,
                _ => 4,
            };
            let (x1, y1) = xy(d(2));
            let (x2, y2) = xy(d(3));
            let (pitch_raw, tiled, sx, sy) = if rule == SizeRule::XyDst {
                (br13 & 0xffff, (d(0) >> 11) & 1 == 1, x1, y1)
            } else {
                let (sx, sy) = xy(d(6));
                (d(7) & 0xffff, (d(0) >> 15) & 1 == 1, sx, sy)
            };
            // Pitch is a signed 16-bit byte count for linear surfaces, dwords when tiled.
            blit_range(
                addr,
                pitch_raw,
                tiled.then_some(32),
                cpp,
                (x1, y1, x2, y2),
                (sx, sy),
            )
        }
        SizeRule::FastDst | SizeRule::FastSrc => {
            // Colour depth (DW1 bits 26:24) as i915 and IGT encode it: 0 8 bpp, 1 16 bpp, 3 32 bpp,
            // 4 64 bpp, 5 128 bpp; the other values are reserved and counted as 128 bpp.
            let dw1 = d(1);
            let cpp = match (dw1 >> 24) & 7 {
                0 => 1u64,
                1 => 2,
                3 => 4,
                4 => 8,
                _ => 16,
            };
            let (x1, y1) = xy(d(2));
            let (x2, y2) = xy(d(3));
            // Tiling: destination DW0 bits 14:13, source DW0 bits 21:20 (0 linear; X, Y/Yf, Ys
            // otherwise); tiled pitches are in dwords.
            let (pitch_raw, tiling, sx, sy) = if rule == SizeRule::FastDst {
                (dw1 & 0xffff, (d(0) >> 13) & 3, x1, y1)
            } else {
                let (sx, sy) = xy(d(6));
                (d(7) & 0xffff, (d(0) >> 20) & 3, sx, sy)
            };
            blit_range(
                addr,
                pitch_raw,
                (tiling != 0).then_some(256),
                cpp,
                (x1, y1, x2, y2),
                (sx, sy),
            )
        }
    };
    r.filter(|(s, l)| s.checked_add(*l).is_some())
}

/// Lazy decoder over a command buffer.
#[derive(Clone, Debug)]
pub struct Decoder<'a> {
    gen: Gen,
    engine: Engine,
    table: table::Table,
    dwords: &'a [u32],
    pos: usize,
    done: bool,
}

impl<'a> Decoder<'a> {
    /// A decoder over `dwords` for `gen`/`engine`.
    pub fn new(gen: Gen, engine: Engine, dwords: &'a [u32]) -> Self {
        Decoder {
            gen,
            engine,
            table: table::Table::new(gen, engine),
            dwords,
            pos: 0,
            done: false,
        }
    }

    /// Dword offset of the next command.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The next command, `Ok(None)` at the end, or the first error (after which the decoder is
    /// empty for good).
    #[allow(clippy::should_implement_trait)]
    #[inline]
    pub fn next(&mut self) -> Result<Option<Decoded<'a>>, DecodeError> {
        if self.done {
            return Ok(None);
        }
        let rest = match self.dwords.get(self.pos..) {
            Some(r) if !r.is_empty() => r,
            _ => {
                self.done = true;
                return Ok(None);
            }
        };
        match decode_with(self.table, self.gen, self.engine, rest, self.pos) {
            Ok(d) => {
                self.pos += d.dwords.len();
                Ok(Some(d))
            }
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }
    }
}

impl<'a> Iterator for Decoder<'a> {
    type Item = Result<Decoded<'a>, DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        Decoder::next(self).transpose()
    }
}

/// Decodes the one command at the start of `rest` (`offset` is reported in errors and in the
/// result).
pub fn decode_one(
    gen: Gen,
    engine: Engine,
    rest: &[u32],
    offset: usize,
) -> Result<Decoded<'_>, DecodeError> {
    decode_with(table::Table::new(gen, engine), gen, engine, rest, offset)
}

#[inline]
fn decode_with(
    table: table::Table,
    gen: Gen,
    engine: Engine,
    rest: &[u32],
    offset: usize,
) -> Result<Decoded<'_>, DecodeError> {
    let dw0 = *rest.first().ok_or(DecodeError::Truncated {
        offset,
        name: "?",
        len: 1,
        available: 0,
    })?;
    let (desc, len) = table
        .lookup_len(dw0)
        .ok_or(DecodeError::UnknownOpcode { offset, dw0 })?;
    decode_desc(desc, len, gen, engine, rest, offset)
}

/// Decodes the command at the start of `rest` whose row `desc` and length `len` (in dwords,
/// `desc.len_of(dw0)`) the caller has looked up from its DW0 ([`table::Table::lookup_len`]).
#[inline]
pub(crate) fn decode_desc<'a>(
    desc: &'static table::CommandDesc,
    len: usize,
    gen: Gen,
    engine: Engine,
    rest: &'a [u32],
    offset: usize,
) -> Result<Decoded<'a>, DecodeError> {
    let dw0 = rest.first().copied().unwrap_or(0);
    let bad = |len| DecodeError::BadLength {
        offset,
        name: desc.name,
        dw0,
        len,
    };
    if let Some(exact) = desc.exact_len {
        if len != usize::from(exact) {
            return Err(bad(len));
        }
    }
    if desc.hook == Hook::LoadRegImm && len.is_multiple_of(2) {
        return Err(bad(len));
    }
    if len == 0 {
        return Err(bad(len));
    }
    let dwords = rest.get(..len).ok_or(DecodeError::Truncated {
        offset,
        name: desc.name,
        len,
        available: rest.len(),
    })?;
    Ok(Decoded {
        gen,
        engine,
        offset,
        desc,
        dwords,
    })
}
