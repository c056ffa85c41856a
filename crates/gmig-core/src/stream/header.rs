//! The stream header, what a destination accepts, the limits it enforces, and device-state
//! section kinds.

use super::error::Result;
use super::error::StreamError;
use super::wire::VgpuTypeId;
use super::wire::WireHeader;
use super::wire::FORMAT_MAJOR;
use super::wire::FORMAT_MINOR;
use super::wire::HEADER_CRC_OFFSET;
use super::wire::HEADER_LEN;
use super::wire::MAGIC;
use super::wire::PAGE_SIZE;
use zerocopy::little_endian::U16;
use zerocopy::little_endian::U32;
use zerocopy::little_endian::U64;
use zerocopy::FromBytes;
use zerocopy::IntoBytes;

/// Guest frame numbers: one type across gmig (defined by `gmig-dirty`, which hashes them).
pub use gmig_dirty::Gfn;

/// GPU generation of the vGPU a stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum GpuGeneration {
    /// Broadwell.
    Gen8 = 8,
    /// Skylake, Kaby Lake, Coffee Lake.
    Gen9 = 9,
    /// Ice Lake.
    Gen11 = 11,
}

impl TryFrom<u8> for GpuGeneration {
    type Error = StreamError;
    fn try_from(value: u8) -> Result<Self> {
        match value {
            8 => Ok(Self::Gen8),
            9 => Ok(Self::Gen9),
            11 => Ok(Self::Gen11),
            _ => Err(StreamError::UnknownGeneration { value }),
        }
    }
}

/// What a stream's header says about the vGPU it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHeader {
    /// Format minor version of the stream (the major is always [`FORMAT_MAJOR`]).
    pub format_minor: u16,
    /// GPU generation.
    pub generation: GpuGeneration,
    /// vGPU type.
    pub vgpu_type: VgpuTypeId,
    /// GGTT byte offset of the source's aperture slice.
    pub src_aperture_base: u64,
    /// GGTT byte offset of the source's hidden slice.
    pub src_hidden_base: u64,
    /// Pages of guest memory; every page record's frame is below this.
    pub guest_pages: u64,
}

impl StreamHeader {
    /// A header of the current format version.
    pub fn new(
        generation: GpuGeneration,
        vgpu_type: VgpuTypeId,
        src_aperture_base: u64,
        src_hidden_base: u64,
        guest_pages: u64,
    ) -> Self {
        Self {
            format_minor: FORMAT_MINOR,
            generation,
            vgpu_type,
            src_aperture_base,
            src_hidden_base,
            guest_pages,
        }
    }

    /// The header's 64 wire bytes, checksum included.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut wire = WireHeader {
            magic: MAGIC,
            major: U16::new(FORMAT_MAJOR),
            minor: U16::new(self.format_minor),
            generation: self.generation as u8,
            reserved0: [0; 3],
            aperture_mib: U32::new(self.vgpu_type.aperture_mib),
            hidden_mib: U32::new(self.vgpu_type.hidden_mib),
            aperture_base: U64::new(self.src_aperture_base),
            hidden_base: U64::new(self.src_hidden_base),
            guest_pages: U64::new(self.guest_pages),
            page_size: U32::new(PAGE_SIZE as u32),
            reserved1: [0; 8],
            crc: U32::new(0),
        };
        let crc = crc32fast::hash(&wire.as_bytes()[..HEADER_CRC_OFFSET]);
        wire.crc = U32::new(crc);
        let mut out = [0u8; HEADER_LEN];
        out.copy_from_slice(wire.as_bytes());
        out
    }

    /// Parse and validate header bytes (magic, checksum, version, reserved fields, limits).
    pub fn parse(bytes: &[u8; HEADER_LEN], limits: &StreamLimits) -> Result<Self> {
        let wire = WireHeader::read_from_bytes(bytes).map_err(|_| StreamError::Truncated {
            offset: 0,
            wanted: HEADER_LEN as u64,
        })?;
        if wire.magic != MAGIC {
            return Err(StreamError::BadMagic { found: wire.magic });
        }
        let computed = crc32fast::hash(&bytes[..HEADER_CRC_OFFSET]);
        if computed != wire.crc.get() {
            return Err(StreamError::HeaderChecksum {
                stored: wire.crc.get(),
                computed,
            });
        }
        let (major, minor) = (wire.major.get(), wire.minor.get());
        if major != FORMAT_MAJOR || minor > FORMAT_MINOR {
            return Err(StreamError::UnsupportedVersion { major, minor });
        }
        let generation = GpuGeneration::try_from(wire.generation)?;
        let bad = |offset: u64, field: &'static str, value: u64| StreamError::BadHeaderField {
            offset,
            field,
            value,
        };
        if wire.reserved0 != [0; 3] {
            return Err(bad(13, "reserved", 0));
        }
        if wire.reserved1 != [0; 8] {
            return Err(bad(52, "reserved", 0));
        }
        if wire.page_size.get() as usize != PAGE_SIZE {
            return Err(bad(48, "page_size", wire.page_size.get().into()));
        }
        let guest_pages = wire.guest_pages.get();
        if guest_pages == 0 || guest_pages > limits.max_guest_pages {
            return Err(bad(40, "guest_pages", guest_pages));
        }
        Ok(Self {
            format_minor: minor,
            generation,
            vgpu_type: VgpuTypeId {
                aperture_mib: wire.aperture_mib.get(),
                hidden_mib: wire.hidden_mib.get(),
            },
            src_aperture_base: wire.aperture_base.get(),
            src_hidden_base: wire.hidden_base.get(),
            guest_pages,
        })
    }

    /// Refuse a stream the destination cannot take.
    pub fn check_compatible(&self, expect: &Compatibility) -> Result<()> {
        if self.generation != expect.generation {
            return Err(StreamError::GenerationMismatch {
                stream: self.generation as u8,
                expected: expect.generation as u8,
            });
        }
        if self.vgpu_type != expect.vgpu_type {
            return Err(StreamError::VgpuTypeMismatch {
                stream: self.vgpu_type,
                expected: expect.vgpu_type,
            });
        }
        Ok(())
    }
}

/// What a destination can take: streams of another generation or vGPU type are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compatibility {
    /// The destination's GPU generation.
    pub generation: GpuGeneration,
    /// The vGPU type the destination has set up.
    pub vgpu_type: VgpuTypeId,
}

/// Bounds a reader enforces before allocating or reading (a denial-of-service guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Largest section payload accepted, in bytes.
    pub max_section_len: u32,
    /// Most bytes one load reads in all, header included.
    pub max_stream_bytes: u64,
    /// Largest guest memory (in pages) a header may declare.
    pub max_guest_pages: u64,
}

impl Default for StreamLimits {
    /// 8 MiB sections (a full page batch is just over 4 MiB), 64 GiB per load, 64 GiB of guest.
    fn default() -> Self {
        Self {
            max_section_len: 8 << 20,
            max_stream_bytes: 64 << 30,
            max_guest_pages: (64u64 << 30) / PAGE_SIZE as u64,
        }
    }
}

/// The kinds of device-state sections. Each of [`StateKind::ALL`] appears exactly once per
/// stream, before END; each of [`StateKind::OPTIONAL`] at most once, after the section it
/// updates ([`StateKind::updates`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum StateKind {
    /// vGPU configuration: type, slices, fences, the paravirtual info page.
    DeviceConfig = 1,
    /// The MMIO register file.
    Registers = 2,
    /// The GGTT entries of the vGPU's slices.
    Ggtt = 3,
    /// PPGTT roots and page-table state.
    Ppgtt = 4,
    /// Engine, ring and execlist state.
    Engines = 5,
    /// Workloads queued but not executed.
    Workloads = 6,
    /// GGTT entries written since the GGTT section (format 1.1): a source that sent the GGTT while
    /// the VM ran (pre-copy) sends only these at the stop.
    GgttUpdate = 9,
    /// The display: virtual monitor, pipes' frame and flip counters, AUX channel (format 1.3).
    /// A stream without it restores a vGPU without a monitor, as its source had.
    Display = 12,
}

impl StateKind {
    /// All device-state kinds, in the order a writer emits them.
    pub const ALL: [StateKind; 6] = [
        StateKind::DeviceConfig,
        StateKind::Registers,
        StateKind::Ggtt,
        StateKind::Ppgtt,
        StateKind::Engines,
        StateKind::Workloads,
    ];

    /// Device-state kinds a stream may carry or leave out.
    pub const OPTIONAL: [StateKind; 2] = [StateKind::GgttUpdate, StateKind::Display];

    /// The section this one updates, which must come before it; `None` for a whole section.
    pub fn updates(self) -> Option<StateKind> {
        match self {
            StateKind::GgttUpdate => Some(StateKind::Ggtt),
            _ => None,
        }
    }

    pub(crate) fn from_wire(kind: u16) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::OPTIONAL)
            .find(|k| *k as u16 == kind)
    }
}
