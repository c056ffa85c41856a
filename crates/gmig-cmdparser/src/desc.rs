//! The schema of the command tables (Mesa style): generations, engines, and one [`CommandDesc`]
//! row per command with its length rule, address fields, flags and [`Hook`]s. The rows are in
//! `rows`; the lookup index over them is in `table`.

use crate::addr::AddressSpace;

/// A GPU generation this crate decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Gen {
    /// Broadwell.
    Gen8,
    /// Skylake, Kaby Lake, Coffee Lake.
    Gen9,
    /// Ice Lake.
    Gen11,
}

impl Gen {
    /// All generations.
    pub const ALL: [Gen; 3] = [Gen::Gen8, Gen::Gen9, Gen::Gen11];

    const fn bit(self) -> u8 {
        match self {
            Gen::Gen8 => 1,
            Gen::Gen9 => 2,
            Gen::Gen11 => 4,
        }
    }

    pub(crate) const fn index(self) -> usize {
        match self {
            Gen::Gen8 => 0,
            Gen::Gen9 => 1,
            Gen::Gen11 => 2,
        }
    }
}

impl core::fmt::Display for Gen {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Gen::Gen8 => "gen8",
            Gen::Gen9 => "gen9",
            Gen::Gen11 => "gen11",
        })
    }
}

impl core::str::FromStr for Gen {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "8" | "gen8" | "bdw" => Ok(Gen::Gen8),
            "9" | "gen9" | "skl" | "kbl" | "cfl" => Ok(Gen::Gen9),
            "11" | "gen11" | "icl" => Ok(Gen::Gen11),
            _ => Err("unknown generation (gen8, gen9, gen11)"),
        }
    }
}

/// A command streamer (engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Engine {
    /// Render command streamer (RCS): MI, 3D, media, GPGPU.
    Render,
    /// Blitter command streamer (BCS): MI and 2D.
    Blitter,
    /// Video command streamer (VCS): MI and MFX.
    Video,
    /// Video enhancement command streamer (VECS): MI and VEBOX.
    VideoEnhance,
}

impl Engine {
    /// All engines.
    pub const ALL: [Engine; 4] = [
        Engine::Render,
        Engine::Blitter,
        Engine::Video,
        Engine::VideoEnhance,
    ];

    const fn bit(self) -> u8 {
        match self {
            Engine::Render => 1,
            Engine::Blitter => 2,
            Engine::Video => 4,
            Engine::VideoEnhance => 8,
        }
    }

    pub(crate) const fn index(self) -> usize {
        match self {
            Engine::Render => 0,
            Engine::Blitter => 1,
            Engine::Video => 2,
            Engine::VideoEnhance => 3,
        }
    }
}

impl core::fmt::Display for Engine {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Engine::Render => "render",
            Engine::Blitter => "blitter",
            Engine::Video => "video",
            Engine::VideoEnhance => "video-enhance",
        })
    }
}

impl core::str::FromStr for Engine {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "render" | "rcs" => Ok(Engine::Render),
            "blitter" | "blt" | "bcs" => Ok(Engine::Blitter),
            "video" | "vcs" => Ok(Engine::Video),
            "video-enhance" | "videoenhance" | "vebox" | "vecs" => Ok(Engine::VideoEnhance),
            _ => Err("unknown engine (render, blitter, video, video-enhance)"),
        }
    }
}

/// A set of engines (bit per [`Engine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Engines(pub u8);

impl Engines {
    /// Render only.
    pub const RCS: Engines = Engines(1);
    /// Blitter only.
    pub const BCS: Engines = Engines(2);
    /// Video only.
    pub const VCS: Engines = Engines(4);
    /// Video enhancement only.
    pub const VECS: Engines = Engines(8);
    /// Render and blitter.
    pub const RCS_BCS: Engines = Engines(3);
    /// Every engine.
    pub const ALL: Engines = Engines(15);

    /// Whether `e` is in the set.
    pub const fn has(self, e: Engine) -> bool {
        self.0 & e.bit() != 0
    }
}

/// A set of generations (bit per [`Gen`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gens(pub u8);

impl Gens {
    /// Gen8 and later.
    pub const ALL: Gens = Gens(7);
    /// Gen9 and later.
    pub const GEN9_PLUS: Gens = Gens(6);
    /// Gen11 only.
    pub const GEN11: Gens = Gens(4);
    /// Gen8 and Gen9.
    pub const GEN8_9: Gens = Gens(3);

    /// Whether `g` is in the set.
    pub const fn has(self, g: Gen) -> bool {
        self.0 & g.bit() != 0
    }
}

/// How a command's total length in dwords is found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LengthRule {
    /// Always this many dwords (e.g. MI_NOOP: 1).
    Fixed(u8),
    /// `(DW0 & ((1 << bits) - 1)) + bias`.
    Variable {
        /// Width of the DWord Length field in bits (6, 8, 10, 12 or 16).
        bits: u8,
        /// Added to the field.
        bias: u8,
    },
}

/// Whether an address field is read, written or both by its command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Access {
    /// Read only.
    Read,
    /// Written only.
    Write,
    /// Read and written.
    ReadWrite,
}

impl Access {
    /// Whether the command may write through the address.
    pub const fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// Which translation an address field goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceRule {
    /// The batch's implicit space (GGTT in the ring and privileged batches, PPGTT otherwise).
    Implicit,
    /// GGTT when bit `bit` of dword `dword` (index within the command) is set, else PPGTT.
    GgttIfBit {
        /// Dword index within the command.
        dword: u8,
        /// Bit number.
        bit: u8,
    },
    /// PPGTT when bit `bit` of dword `dword` is set, else GGTT (MI_BATCH_BUFFER_START bit 8).
    PpgttIfBit {
        /// Dword index within the command.
        dword: u8,
        /// Bit number.
        bit: u8,
    },
}

/// When an address field is in use (a field not in use is neither audited nor remapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// Always (when it fits inside the command).
    Always,
    /// When bits `lo .. lo + bits` of dword `dword` are not all zero (post-sync op, modify
    /// enable, read length …).
    NonZero {
        /// Dword index within the command (relative to the repeated element's start).
        dword: u8,
        /// Lowest bit.
        lo: u8,
        /// Number of bits.
        bits: u8,
    },
    /// When bit `bit` of dword `dword` is set.
    BitSet {
        /// Dword index within the command (relative to the repeated element's start).
        dword: u8,
        /// Bit number.
        bit: u8,
    },
    /// When bit `bit` of dword `dword` is clear.
    BitClear {
        /// Dword index within the command (relative to the repeated element's start).
        dword: u8,
        /// Bit number.
        bit: u8,
    },
    /// When every one of these holds (a post-sync write that is not a store-data-index one).
    All(&'static [Cond]),
}

/// Which hardware status page a store-data-index write lands in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusPage {
    /// The submitting context's per-process status page (the first page of its image).
    PerProcess,
    /// The per-process page when bit `bit` of dword `dword` is set, else the engine's global
    /// status page (`HWS_PGA`): MI_STORE_DATA_INDEX's "use per-process HWS".
    PerProcessIfBit {
        /// Dword index within the command.
        dword: u8,
        /// Bit number.
        bit: u8,
    },
}

/// A write whose "address" is an offset into a hardware status page, not a graphics address
/// (MI_STORE_DATA_INDEX, and PIPE_CONTROL / MI_FLUSH_DW with "store data index"): GVT-g checks
/// that it stays inside the page; it is never remapped, and the page is the context's or the
/// engine's own, inside the vGPU's slices by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexRule {
    /// When the command writes by index.
    pub when: Cond,
    /// Dword holding the byte offset.
    pub dword: u8,
    /// Its lowest offset bit (the bits below are flags or must be zero).
    pub lo: u8,
    /// Which page.
    pub page: StatusPage,
    /// Bytes written.
    pub size: SizeRule,
}

/// How many bytes an address field's command touches from the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeRule {
    /// Unknown: only the first byte is known to be touched; writes through it make the write set
    /// [`WriteSet::Unknown`](crate::WriteSet::Unknown).
    Unknown,
    /// Exactly this many bytes.
    Fixed(u32),
    /// `(command length - first) * 4` bytes: the trailing data dwords (MI_STORE_DATA_IMM).
    TrailingDwords {
        /// Dword index of the first data dword.
        first: u8,
    },
    /// `((dword >> lo) & mask(bits)) * scale + add` bytes; `dword` is relative to the element.
    Field {
        /// Dword index (relative to the repeated element's start).
        dword: u8,
        /// Lowest bit.
        lo: u8,
        /// Number of bits.
        bits: u8,
        /// Multiplier.
        scale: u32,
        /// Addend (after multiplying).
        add: u32,
    },
    /// Destination rectangle of a legacy `XY_*` blit (BR13 in DW1, corners in DW2/DW3, tiling
    /// in DW0 bit 11).
    XyDst,
    /// Source rectangle of `XY_SRC_COPY_BLT`-style blits (corner in DW6, pitch in DW7, tiling in
    /// DW0 bit 15, size of the destination rectangle).
    XySrc,
    /// Destination rectangle of `XY_FAST_COPY_BLT` (colour depth in DW1 bits 26:24, pitch in DW1,
    /// corners in DW2/DW3, tiling in DW0 bits 14:13; tiled surfaces count whole rows of the
    /// tallest tile, 256 rows).
    FastDst,
    /// Source rectangle of `XY_FAST_COPY_BLT` (corner in DW6, pitch in DW7, tiling in DW0 bits
    /// 21:20).
    FastSrc,
}

/// Width of an address field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Width {
    /// One dword; address bits `lo..=31`.
    A32,
    /// Two dwords; address bits `lo..=47` of the little-endian qword.
    A48,
    /// Two dwords; address bits `lo..=63` of the little-endian qword.
    A64,
}

impl Width {
    /// Dwords the field occupies.
    pub const fn dwords(self) -> usize {
        match self {
            Width::A32 => 1,
            Width::A48 | Width::A64 => 2,
        }
    }

    /// Highest address bit + 1.
    pub const fn top(self) -> u32 {
        match self {
            Width::A32 => 32,
            Width::A48 => 48,
            Width::A64 => 64,
        }
    }
}

/// One graphics address inside a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrField {
    /// Short field name, e.g. `"dst"`.
    pub name: &'static str,
    /// Dword index of the (low) address dword within the command.
    pub dword: u8,
    /// Lowest address bit; bits below it belong to other fields and are preserved.
    pub lo: u8,
    /// Width.
    pub width: Width,
    /// Which GTT it goes through.
    pub space: SpaceRule,
    /// Read or written.
    pub access: Access,
    /// Bytes touched.
    pub size: SizeRule,
    /// When it is in use.
    pub cond: Cond,
    /// `Some(stride)`: the field repeats every `stride` dwords to the end of the command
    /// (arrays of structures such as VERTEX_BUFFER_STATE).
    pub repeat: Option<u8>,
}

impl AddrField {
    /// A 48-bit address at `dword`, bits `lo..=47`, implicit space, unknown size, read.
    pub const fn new(name: &'static str, dword: u8, lo: u8) -> Self {
        AddrField {
            name,
            dword,
            lo,
            width: Width::A48,
            space: SpaceRule::Implicit,
            access: Access::Read,
            size: SizeRule::Unknown,
            cond: Cond::Always,
            repeat: None,
        }
    }

    /// With width `w`.
    pub const fn width(mut self, w: Width) -> Self {
        self.width = w;
        self
    }

    /// With space rule `s`.
    pub const fn space(mut self, s: SpaceRule) -> Self {
        self.space = s;
        self
    }

    /// With access `a`.
    pub const fn access(mut self, a: Access) -> Self {
        self.access = a;
        self
    }

    /// With size rule `s`.
    pub const fn size(mut self, s: SizeRule) -> Self {
        self.size = s;
        self
    }

    /// With condition `c`.
    pub const fn when(mut self, c: Cond) -> Self {
        self.cond = c;
        self
    }

    /// Repeating every `stride` dwords.
    pub const fn repeat(mut self, stride: u8) -> Self {
        self.repeat = Some(stride);
        self
    }

    /// Mask of the address bits within the (little-endian) field value.
    pub const fn mask(&self) -> u64 {
        let top = self.width.top();
        let all = if top == 64 {
            u64::MAX
        } else {
            (1u64 << top) - 1
        };
        all & !((1u64 << self.lo) - 1)
    }
}

/// Named special cases the generic decoder and audit hand over to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// Nothing special.
    None,
    /// MI_BATCH_BUFFER_START: jump/call.
    BatchStart,
    /// MI_BATCH_BUFFER_END: return.
    BatchEnd,
    /// MI_LOAD_REGISTER_IMM: (register, value) pairs from DW1; registers must be whitelisted.
    LoadRegImm,
    /// MI_LOAD_REGISTER_MEM: register in DW1.
    LoadRegMem,
    /// MI_STORE_REGISTER_MEM: register in DW1 (read).
    StoreRegMem,
    /// MI_LOAD_REGISTER_REG: source in DW1, destination in DW2.
    LoadRegReg,
    /// A store-data-index write into a status page (see [`IndexRule`]).
    StatusIndex(&'static IndexRule),
}

/// Command classes by DW0 bits 31:29 and engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Type 0: MI commands (opcode DW0 bits 28:23).
    Mi,
    /// Type 2: 2D blitter commands (opcode bits 28:22).
    Blit,
    /// Type 3 on the render engine: 3D, media, GPGPU (bits 28:16).
    Render3d,
    /// Type 3 on the video engine: MFX/MFD/MFC/HCP/HUC (bits 28:16).
    Mfx,
    /// Type 3 on the video-enhancement engine: VEBOX (bits 28:16).
    Vebox,
}

impl Class {
    /// The opcode key of `dw0` for this class: the bits above the class's opcode shift,
    /// command type included.
    pub const fn key(self, dw0: u32) -> u32 {
        match self {
            Class::Mi => dw0 >> 23,
            Class::Blit => dw0 >> 22,
            Class::Render3d | Class::Mfx | Class::Vebox => dw0 >> 16,
        }
    }
}

/// Flag bits of a [`CommandDesc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flags(pub u16);

impl Flags {
    /// No flags.
    pub const NONE: Flags = Flags(0);
    /// A mediated parser must refuse the command (GVT-g's list; see the crate docs).
    pub const REFUSED: Flags = Flags(1);
    /// The command's address fields are not modelled: refused where addresses are GGTT (ring
    /// and privileged batches), allowed in PPGTT batches; its writes are unknown.
    pub const OPAQUE: Flags = Flags(2);
    /// The command may write memory that its address fields do not bound (draws, dispatches,
    /// media/video processing, stream-out): its write set is unknown.
    pub const UNBOUNDED_WRITES: Flags = Flags(4);

    /// Union.
    pub const fn with(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }

    /// Whether all bits of `o` are set.
    pub const fn has(self, o: Flags) -> bool {
        self.0 & o.0 == o.0
    }
}

/// One command of the tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandDesc {
    /// Name as in the PRMs, Mesa and GVT-g, e.g. `"MI_STORE_DATA_IMM"`.
    pub name: &'static str,
    /// Class (DW0 bits 31:29 and engine).
    pub class: Class,
    /// Opcode key: `class.key(dw0)` must equal it.
    pub opcode: u32,
    /// Length rule.
    pub length: LengthRule,
    /// `Some(n)`: the command must be exactly `n` dwords long (GVT-g's `F_LEN_VAR_FIXED`).
    pub exact_len: Option<u8>,
    /// Engines it exists on.
    pub engines: Engines,
    /// Generations it exists on.
    pub gens: Gens,
    /// Flags.
    pub flags: Flags,
    /// Address fields.
    pub addrs: &'static [AddrField],
    /// Special handling.
    pub hook: Hook,
}

impl CommandDesc {
    /// The length in dwords of the command starting with `dw0`.
    #[inline]
    pub const fn len_of(&self, dw0: u32) -> usize {
        match self.length {
            LengthRule::Fixed(n) => n as usize,
            LengthRule::Variable { bits, bias } => {
                (dw0 & ((1u32 << bits) - 1)) as usize + bias as usize
            }
        }
    }

    /// DW0 with the opcode bits of this command and the given dword-length field (a convenience
    /// for building command buffers).
    pub const fn header(&self, total_len: u32) -> u32 {
        let shift = match self.class {
            Class::Mi => 23,
            Class::Blit => 22,
            _ => 16,
        };
        let len_field = match self.length {
            LengthRule::Fixed(_) => 0,
            LengthRule::Variable { bias, .. } => total_len.saturating_sub(bias as u32),
        };
        (self.opcode << shift) | len_field
    }

    /// Whether the command exists on `gen` and `engine`.
    pub const fn available(&self, gen: Gen, engine: Engine) -> bool {
        self.gens.has(gen) && self.engines.has(engine)
    }
}

/// The class DW0 belongs to on `engine`, or `None` when the command type is not decoded there.
pub const fn class_of(engine: Engine, dw0: u32) -> Option<Class> {
    match (dw0 >> 29, engine) {
        (0, _) => Some(Class::Mi),
        (2, Engine::Blitter) => Some(Class::Blit),
        (3, Engine::Render) => Some(Class::Render3d),
        (3, Engine::Video) => Some(Class::Mfx),
        (3, Engine::VideoEnhance) => Some(Class::Vebox),
        _ => None,
    }
}

/// The space an address field uses, given the command dwords and the batch's implicit space.
#[inline]
pub(crate) fn resolve_space(
    rule: SpaceRule,
    dwords: &[u32],
    implicit: AddressSpace,
) -> AddressSpace {
    let bit = |dword: u8, bit: u8| {
        dwords
            .get(usize::from(dword))
            .is_some_and(|v| (v >> bit) & 1 == 1)
    };
    match rule {
        SpaceRule::Implicit => implicit,
        SpaceRule::GgttIfBit { dword, bit: b } => {
            if bit(dword, b) {
                AddressSpace::Ggtt
            } else {
                AddressSpace::Ppgtt
            }
        }
        SpaceRule::PpgttIfBit { dword, bit: b } => {
            if bit(dword, b) {
                AddressSpace::Ppgtt
            } else {
                AddressSpace::Ggtt
            }
        }
    }
}
