//! vfio-user wire format: the 16-byte header, the command numbers, and the fixed parts of the
//! messages gmig serves, each with a total decoder (every length a peer supplies is checked against
//! the bytes that arrived) and an encoder. Layouts follow the vfio-user specification (QEMU's
//! `docs/interop/vfio-user.rst`) and the kernel VFIO uAPI it borrows from; all integers are
//! little-endian.

/// An errno for an error reply (the header's `errno` field with `FLAG_ERROR`).
pub type Errno = i32;

/// Size of the message header.
pub const HEADER_LEN: usize = 16;
/// Header flags: message type mask (bits 0–3).
pub const FLAG_TYPE_MASK: u32 = 0xf;
/// Message type: command.
pub const FLAG_COMMAND: u32 = 0;
/// Message type: reply.
pub const FLAG_REPLY: u32 = 1;
/// The sender expects no reply.
pub const FLAG_NO_REPLY: u32 = 1 << 4;
/// The reply carries an error (errno in the header's error field).
pub const FLAG_ERROR: u32 = 1 << 5;

/// `VFIO_DEVICE_FEATURE` flags: feature index mask.
pub const FEATURE_MASK: u32 = 0xffff;
/// `VFIO_DEVICE_FEATURE_GET`.
pub const FEATURE_GET: u32 = 1 << 16;
/// `VFIO_DEVICE_FEATURE_SET`.
pub const FEATURE_SET: u32 = 1 << 17;
/// `VFIO_DEVICE_FEATURE_PROBE`.
pub const FEATURE_PROBE: u32 = 1 << 18;
/// `VFIO_DEVICE_FEATURE_MIGRATION`: `u64 flags` (STOP_COPY 1, P2P 2, PRE_COPY 4).
pub const FEATURE_MIGRATION: u32 = 1;
/// `VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE`: `u32 device_state, s32 data_fd`.
pub const FEATURE_MIG_DEVICE_STATE: u32 = 2;
/// `VFIO_DEVICE_FEATURE_DMA_LOGGING_START`.
pub const FEATURE_DMA_LOGGING_START: u32 = 6;
/// `VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP`.
pub const FEATURE_DMA_LOGGING_STOP: u32 = 7;
/// `VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT`.
pub const FEATURE_DMA_LOGGING_REPORT: u32 = 8;
/// Bytes before the ranges of a DMA_LOGGING_START/STOP request (`page_size`, `num_ranges`,
/// reserved) and before the bitmap of a DMA_LOGGING_REPORT (`iova`, `length`, `page_size`).
pub const DMA_LOGGING_CONTROL_LEN: usize = 16;
/// See [`DMA_LOGGING_CONTROL_LEN`].
pub const DMA_LOGGING_REPORT_LEN: usize = 24;
/// `VFIO_DEVICE_FEATURE_MIG_DATA_SIZE`: `u64 stop_copy_length`.
pub const FEATURE_MIG_DATA_SIZE: u32 = 9;

/// vfio-user commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Command {
    /// `VFIO_USER_VERSION`.
    Version = 1,
    /// `VFIO_USER_DMA_MAP`.
    DmaMap = 2,
    /// `VFIO_USER_DMA_UNMAP`.
    DmaUnmap = 3,
    /// `VFIO_USER_DEVICE_GET_INFO`.
    DeviceGetInfo = 4,
    /// `VFIO_USER_DEVICE_GET_REGION_INFO`.
    DeviceGetRegionInfo = 5,
    /// `VFIO_USER_DEVICE_GET_REGION_IO_FDS`.
    DeviceGetRegionIoFds = 6,
    /// `VFIO_USER_DEVICE_GET_IRQ_INFO`.
    DeviceGetIrqInfo = 7,
    /// `VFIO_USER_DEVICE_SET_IRQS`.
    DeviceSetIrqs = 8,
    /// `VFIO_USER_REGION_READ`.
    RegionRead = 9,
    /// `VFIO_USER_REGION_WRITE`.
    RegionWrite = 10,
    /// `VFIO_USER_DMA_READ` (server to client).
    DmaRead = 11,
    /// `VFIO_USER_DMA_WRITE` (server to client).
    DmaWrite = 12,
    /// `VFIO_USER_DEVICE_RESET`.
    DeviceReset = 13,
    /// `VFIO_USER_REGION_WRITE_MULTI`.
    RegionWriteMulti = 15,
    /// `VFIO_USER_DEVICE_FEATURE`.
    DeviceFeature = 16,
    /// `VFIO_USER_MIG_DATA_READ`.
    MigDataRead = 17,
    /// `VFIO_USER_MIG_DATA_WRITE`.
    MigDataWrite = 18,
}

impl TryFrom<u16> for Command {
    type Error = ProtoError;
    fn try_from(v: u16) -> Result<Self, ProtoError> {
        use Command as C;
        Ok(match v {
            1 => C::Version,
            2 => C::DmaMap,
            3 => C::DmaUnmap,
            4 => C::DeviceGetInfo,
            5 => C::DeviceGetRegionInfo,
            6 => C::DeviceGetRegionIoFds,
            7 => C::DeviceGetIrqInfo,
            8 => C::DeviceSetIrqs,
            9 => C::RegionRead,
            10 => C::RegionWrite,
            11 => C::DmaRead,
            12 => C::DmaWrite,
            13 => C::DeviceReset,
            15 => C::RegionWriteMulti,
            16 => C::DeviceFeature,
            17 => C::MigDataRead,
            18 => C::MigDataWrite,
            other => return Err(ProtoError::UnknownCommand(other)),
        })
    }
}

/// Malformed input, with the offending value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// The command number is not one vfio-user defines.
    #[error("unknown vfio-user command {0}")]
    UnknownCommand(u16),
    /// A message ended before a field: `need` bytes at `offset`, `have` in all.
    #[error("message too short: {need} bytes needed at offset {offset}, {have} present")]
    Short {
        /// Where the field starts in the payload.
        offset: usize,
        /// Bytes the field needs.
        need: usize,
        /// Bytes the payload has.
        have: usize,
    },
    /// The header's size is smaller than the header or larger than allowed.
    #[error("message size {size} outside {min}..={max}")]
    BadSize {
        /// The size the header declares.
        size: u32,
        /// The least acceptable.
        min: u32,
        /// The most acceptable.
        max: u32,
    },
    /// A declared length disagrees with the bytes present.
    #[error("{what} is {declared}, but {present} bytes are present")]
    LengthMismatch {
        /// The field.
        what: &'static str,
        /// Its value.
        declared: u64,
        /// The bytes present.
        present: u64,
    },
}

/// The message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message id; a reply repeats its command's.
    pub msg_id: u16,
    /// Command number.
    pub command: u16,
    /// Message size, header included.
    pub size: u32,
    /// Flags (type, no-reply, error).
    pub flags: u32,
    /// errno of an error reply.
    pub error: u32,
}

impl Header {
    /// The header of a command `command` numbered `msg_id` carrying `payload_len` bytes.
    pub fn command(msg_id: u16, command: Command, payload_len: usize) -> Header {
        Header {
            msg_id,
            command: command as u16,
            size: (HEADER_LEN + payload_len) as u32,
            flags: FLAG_COMMAND,
            error: 0,
        }
    }

    /// The header of the reply to command `cmd` carrying `payload_len` bytes, with `error` (an
    /// errno) when it refuses.
    pub fn reply(cmd: Header, payload_len: usize, error: Option<i32>) -> Header {
        Header {
            msg_id: cmd.msg_id,
            command: cmd.command,
            size: (HEADER_LEN + payload_len) as u32,
            flags: FLAG_REPLY | if error.is_some() { FLAG_ERROR } else { 0 },
            error: error.map_or(0, i32::cast_unsigned),
        }
    }

    /// Encodes the header.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&self.msg_id.to_le_bytes());
        b[2..4].copy_from_slice(&self.command.to_le_bytes());
        b[4..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..16].copy_from_slice(&self.error.to_le_bytes());
        b
    }

    /// Decodes a header and checks its size against `max_size`.
    pub fn parse(b: &[u8; HEADER_LEN], max_size: u32) -> Result<Header, ProtoError> {
        let mut r = Reader::new(b);
        let h = Header {
            msg_id: r.u16()?,
            command: r.u16()?,
            size: r.u32()?,
            flags: r.u32()?,
            error: r.u32()?,
        };
        if h.size < HEADER_LEN as u32 || h.size > max_size {
            return Err(ProtoError::BadSize {
                size: h.size,
                min: HEADER_LEN as u32,
                max: max_size,
            });
        }
        Ok(h)
    }

    /// Whether this is a reply.
    pub fn is_reply(self) -> bool {
        self.flags & FLAG_TYPE_MASK == FLAG_REPLY
    }

    /// Bytes of payload after the header.
    pub fn payload_len(self) -> usize {
        self.size as usize - HEADER_LEN
    }
}

/// A bounds-checked little-endian reader over a payload.
#[derive(Debug)]
pub struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Reads `b` from its start.
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b, at: 0 }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self.at.checked_add(n);
        let s = end
            .and_then(|e| self.b.get(self.at..e))
            .ok_or(ProtoError::Short {
                offset: self.at,
                need: n,
                have: self.b.len(),
            })?;
        self.at += n;
        Ok(s)
    }

    /// A `u16`.
    pub fn u16(&mut self) -> Result<u16, ProtoError> {
        let s = self.bytes(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    /// A `u32`.
    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        let s = self.bytes(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = self.b.get(self.at..).unwrap_or(&[]);
        self.at = self.b.len();
        s
    }
}

/// Appends little-endian fields.
pub trait Put {
    /// Appends a `u16`.
    fn put16(&mut self, v: u16);
    /// Appends a `u32`.
    fn put32(&mut self, v: u32);
    /// Appends a `u64`.
    fn put64(&mut self, v: u64);
}

impl Put for Vec<u8> {
    fn put16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
}

/// A field of a fixed little-endian wire struct.
trait Field: Sized {
    fn read(r: &mut Reader<'_>) -> Result<Self, ProtoError>;
    fn put(self, out: &mut Vec<u8>);
}

impl Field for u32 {
    fn read(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        r.u32()
    }
    fn put(self, out: &mut Vec<u8>) {
        out.put32(self);
    }
}

impl Field for u64 {
    fn read(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        r.u64()
    }
    fn put(self, out: &mut Vec<u8>) {
        out.put64(self);
    }
}

/// Declares a fixed little-endian wire struct: the fields in wire order, its encoded size `LEN`
/// (checked at compile time against the fields), and a private field-by-field reader and writer.
macro_rules! wire_struct {
    (
        $(#[$m:meta])*
        $name:ident, $len:expr, {
            $($(#[$fm:meta])* $f:ident: $t:ty),+ $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t),+
        }

        impl $name {
            /// Encoded size (of the fixed part).
            pub const LEN: usize = $len;

            fn read_fields(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
                Ok($name { $($f: Field::read(r)?),+ })
            }

            fn put_fields(self, out: &mut Vec<u8>) {
                $(Field::put(self.$f, out);)+
            }
        }

        const _: () = assert!($len == 0 $(+ std::mem::size_of::<$t>())+);
    };
}

wire_struct! {
    /// `VFIO_USER_DMA_MAP` request (32 bytes): the client's memory at `address..address+size`
    /// is the file passed with the message, from `offset`.
    DmaMap, 32, {
        /// `argsz`.
        argsz: u32,
        /// Bit 0 readable, bit 1 writable.
        flags: u32,
        /// Offset in the file.
        offset: u64,
        /// Start of the range in the device's DMA (guest-physical) space.
        address: u64,
        /// Length in bytes.
        size: u64,
    }
}

wire_struct! {
    /// `VFIO_USER_DMA_UNMAP` request (24 bytes).
    DmaUnmap, 24, {
        /// `argsz`.
        argsz: u32,
        /// Flags (none supported).
        flags: u32,
        /// Start of the range.
        address: u64,
        /// Length in bytes.
        size: u64,
    }
}

wire_struct! {
    /// `REGION_READ` / `REGION_WRITE` fixed part (16 bytes), followed by `count` data bytes in a
    /// write request and in a read reply.
    RegionAccess, 16, {
        /// Offset in the region.
        offset: u64,
        /// Region index.
        region: u32,
        /// Bytes.
        count: u32,
    }
}

wire_struct! {
    /// `VFIO_USER_DEVICE_FEATURE` fixed part (`struct vfio_device_feature`: `argsz`, `flags`),
    /// followed by the feature's data.
    Feature, 8, {
        /// `argsz`: the fixed part plus the data.
        argsz: u32,
        /// Feature index (low 16 bits) and GET / SET / PROBE.
        flags: u32,
    }
}

wire_struct! {
    /// `MIG_DATA_READ` / `MIG_DATA_WRITE` fixed part (`argsz`, `size`), followed by `size` bytes in
    /// a write request and in a read reply.
    MigData, 8, {
        /// `argsz`: the fixed part plus the data.
        argsz: u32,
        /// Bytes asked for (read request) or carried (write request, read reply).
        size: u32,
    }
}

wire_struct! {
    /// `VFIO_USER_DEVICE_GET_REGION_INFO` request and reply fixed part (`struct vfio_region_info`,
    /// 32 bytes). In a reply, `argsz` is the size the whole answer needs (fixed part plus the
    /// capability chain); the chain is present only when the request's `argsz` had room for it.
    RegionInfo, 32, {
        /// `argsz`.
        argsz: u32,
        /// `VFIO_REGION_INFO_FLAG_*` (READ 1, WRITE 2, MMAP 4, CAPS 8).
        flags: u32,
        /// Region index.
        index: u32,
        /// Offset of the first capability from the start of this struct (0: none).
        cap_offset: u32,
        /// Region size.
        size: u64,
        /// For a mappable region, the offset to pass to `mmap` on the descriptor sent with the
        /// reply.
        offset: u64,
    }
}

wire_struct! {
    /// `VFIO_USER_DMA_READ` / `VFIO_USER_DMA_WRITE` fixed part (server to client, 16 bytes),
    /// followed by `count` data bytes in a write request and in a read reply.
    DmaAccess, 16, {
        /// DMA address.
        address: u64,
        /// Bytes.
        count: u64,
    }
}

wire_struct! {
    /// `VFIO_USER_DEVICE_GET_REGION_IO_FDS` request and reply fixed part (16 bytes). In a reply,
    /// `argsz` is what the whole answer needs and `count` the number of sub-regions; the entries
    /// follow only when the request's `argsz` had room for them.
    IoFdsHead, 16, {
        /// `argsz`.
        argsz: u32,
        /// Flags (none defined).
        flags: u32,
        /// Region index.
        index: u32,
        /// Sub-regions.
        count: u32,
    }
}

wire_struct! {
    /// One `GET_REGION_IO_FDS` sub-region (40 bytes): writes of `size` bytes at `offset` in the
    /// region signal the descriptor `fd_index` (among those sent with the reply) instead of
    /// becoming REGION_WRITE messages.
    IoFdEntry, 40, {
        /// Offset in the region.
        offset: u64,
        /// Access size in bytes.
        size: u64,
        /// Index of the descriptor among those sent with the reply.
        fd_index: u32,
        /// `0`: ioeventfd; `1`: ioregionfd.
        kind: u32,
        /// Bit 0: `datamatch` is valid (only writes of that value signal).
        flags: u32,
        /// Zero.
        padding: u32,
        /// The value a write must carry, with flag bit 0.
        datamatch: u64,
    }
}

/// `GET_REGION_IO_FDS` sub-region type: ioeventfd.
pub const IO_FD_IOEVENTFD: u32 = 0;
/// `GET_REGION_IO_FDS` sub-region flag: `datamatch` is valid.
pub const IO_FD_DATAMATCH: u32 = 1;

wire_struct! {
    /// One write of `VFIO_USER_REGION_WRITE_MULTI` (24 bytes, up to 8 data bytes).
    WriteMultiEntry, 24, {
        /// Offset in the region.
        offset: u64,
        /// Region index.
        region: u32,
        /// Bytes of `data` used (1 to 8).
        count: u32,
        /// The data, little-endian in its first `count` bytes.
        data: u64,
    }
}

/// Most writes one `REGION_WRITE_MULTI` carries.
pub const WRITE_MULTI_MAX: usize = 200;

/// `struct vfio_region_sparse_mmap_area`: the part of a region a client may `mmap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparseArea {
    /// Offset in the region.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

/// `VFIO_REGION_INFO_CAP_SPARSE_MMAP`'s capability id and the version gmig writes.
const CAP_SPARSE_MMAP: u16 = vfio_bindings::bindings::vfio::VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16;
/// Most capabilities followed in one chain (a loop guard).
const MAX_CAPS: usize = 16;
/// Most sparse areas accepted in one capability.
pub const MAX_SPARSE_AREAS: usize = 64;

/// Encodes a `VFIO_REGION_INFO_CAP_SPARSE_MMAP` capability (header: id, version 1, next 0; then
/// `nr_areas`, reserved, and the areas), to be placed right after the 32-byte region info.
pub fn sparse_mmap_cap(areas: &[SparseArea]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + 16 * areas.len());
    v.put16(CAP_SPARSE_MMAP);
    v.put16(1);
    v.put32(0);
    v.put32(areas.len() as u32);
    v.put32(0);
    for a in areas {
        v.put64(a.offset);
        v.put64(a.size);
    }
    v
}

/// Finds the sparse-mmap areas in a region-info reply (`reply` starts at the 32-byte fixed part):
/// follows the capability chain from `cap_offset`, each offset relative to the start of the
/// fixed part, refusing offsets that point backwards or outside the reply and chains longer than
/// a few capabilities. Unknown capabilities are skipped. `Ok(None)` when the chain has no sparse
/// capability.
pub fn parse_sparse_mmap(
    reply: &[u8],
    cap_offset: u32,
) -> Result<Option<Vec<SparseArea>>, ProtoError> {
    let mut at = cap_offset as usize;
    let mut seen = 0;
    while at != 0 {
        seen += 1;
        if seen > MAX_CAPS || at < RegionInfo::LEN {
            return Err(ProtoError::LengthMismatch {
                what: "capability offset",
                declared: at as u64,
                present: reply.len() as u64,
            });
        }
        let mut r = Reader::new(reply.get(at..).ok_or(ProtoError::Short {
            offset: at,
            need: 8,
            have: reply.len(),
        })?);
        let (id, _version, next) = (r.u16()?, r.u16()?, r.u32()?);
        if id == CAP_SPARSE_MMAP {
            let (n, _reserved) = (r.u32()? as usize, r.u32()?);
            if n > MAX_SPARSE_AREAS {
                return Err(ProtoError::LengthMismatch {
                    what: "sparse mmap nr_areas",
                    declared: n as u64,
                    present: MAX_SPARSE_AREAS as u64,
                });
            }
            let areas = (0..n)
                .map(|_| {
                    Ok(SparseArea {
                        offset: r.u64()?,
                        size: r.u64()?,
                    })
                })
                .collect::<Result<_, ProtoError>>()?;
            return Ok(Some(areas));
        }
        let next = next as usize;
        if next != 0 && next <= at {
            return Err(ProtoError::LengthMismatch {
                what: "capability next (must move forward)",
                declared: next as u64,
                present: at as u64,
            });
        }
        at = next;
    }
    Ok(None)
}

/// Decodes a fixed part and returns it with the bytes after it.
fn with_rest<T>(
    p: &[u8],
    read: fn(&mut Reader<'_>) -> Result<T, ProtoError>,
) -> Result<(T, &[u8]), ProtoError> {
    let mut r = Reader::new(p);
    let fixed = read(&mut r)?;
    Ok((fixed, r.rest()))
}

/// Encodes a fixed part followed by `data`.
fn then_data(len: usize, put: impl FnOnce(&mut Vec<u8>), data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + data.len());
    put(&mut v);
    v.extend_from_slice(data);
    v
}

impl DmaMap {
    /// Decodes the request.
    pub fn parse(p: &[u8]) -> Result<Self, ProtoError> {
        Self::read_fields(&mut Reader::new(p))
    }

    /// Encodes the request.
    pub fn to_bytes(self) -> Vec<u8> {
        then_data(Self::LEN, |v| self.put_fields(v), &[])
    }
}

impl DmaUnmap {
    /// Decodes the request.
    pub fn parse(p: &[u8]) -> Result<Self, ProtoError> {
        Self::read_fields(&mut Reader::new(p))
    }

    /// Encodes the request.
    pub fn to_bytes(self) -> Vec<u8> {
        then_data(Self::LEN, |v| self.put_fields(v), &[])
    }
}

impl RegionAccess {
    /// Decodes the fixed part; returns it and the bytes after it.
    pub fn parse(p: &[u8]) -> Result<(Self, &[u8]), ProtoError> {
        with_rest(p, Self::read_fields)
    }

    /// Encodes the fixed part followed by `data`.
    pub fn to_bytes(self, data: &[u8]) -> Vec<u8> {
        then_data(Self::LEN, |v| self.put_fields(v), data)
    }
}

impl Feature {
    /// Decodes the fixed part; returns it and the data after it.
    pub fn parse(p: &[u8]) -> Result<(Self, &[u8]), ProtoError> {
        with_rest(p, Self::read_fields)
    }

    /// Encodes the fixed part followed by `data`, with `argsz` covering both.
    pub fn to_bytes(flags: u32, data: &[u8]) -> Vec<u8> {
        let f = Feature {
            argsz: (Self::LEN + data.len()) as u32,
            flags,
        };
        then_data(Self::LEN, |v| f.put_fields(v), data)
    }

    /// Encodes the fixed part followed by `data`, with `argsz` (the room for the reply) given:
    /// a GET whose reply is longer than its request (DMA_LOGGING_REPORT) says so here.
    pub fn to_bytes_with_argsz(argsz: u32, flags: u32, data: &[u8]) -> Vec<u8> {
        let f = Feature { argsz, flags };
        then_data(Self::LEN, |v| f.put_fields(v), data)
    }

    /// The feature index.
    pub fn index(self) -> u32 {
        self.flags & FEATURE_MASK
    }
}

impl RegionInfo {
    /// Decodes the fixed part; returns it and the bytes after it (the capability chain).
    pub fn parse(p: &[u8]) -> Result<(Self, &[u8]), ProtoError> {
        with_rest(p, Self::read_fields)
    }

    /// Encodes the fixed part followed by `caps`.
    pub fn to_bytes(self, caps: &[u8]) -> Vec<u8> {
        then_data(Self::LEN, |v| self.put_fields(v), caps)
    }
}

impl DmaAccess {
    /// Decodes the fixed part; returns it and the bytes after it.
    pub fn parse(p: &[u8]) -> Result<(Self, &[u8]), ProtoError> {
        with_rest(p, Self::read_fields)
    }

    /// Encodes the fixed part followed by `data`.
    pub fn to_bytes(self, data: &[u8]) -> Vec<u8> {
        then_data(Self::LEN, |v| self.put_fields(v), data)
    }
}

impl IoFdsHead {
    /// Decodes the fixed part; returns it and the bytes after it (the sub-regions).
    pub fn parse(p: &[u8]) -> Result<(Self, &[u8]), ProtoError> {
        with_rest(p, Self::read_fields)
    }

    /// Encodes the fixed part followed by `entries`.
    pub fn to_bytes(self, entries: &[IoFdEntry]) -> Vec<u8> {
        let mut v = then_data(Self::LEN, |v| self.put_fields(v), &[]);
        for e in entries {
            e.put_fields(&mut v);
        }
        v
    }
}

impl IoFdEntry {
    /// Decodes `count` entries from `p`, which must hold exactly them.
    pub fn parse_all(p: &[u8], count: u32) -> Result<Vec<Self>, ProtoError> {
        let want = (count as u64) * Self::LEN as u64;
        if p.len() as u64 != want {
            return Err(ProtoError::LengthMismatch {
                what: "GET_REGION_IO_FDS sub-regions",
                declared: want,
                present: p.len() as u64,
            });
        }
        let mut r = Reader::new(p);
        (0..count).map(|_| Self::read_fields(&mut r)).collect()
    }
}

impl WriteMultiEntry {
    /// Decodes a `REGION_WRITE_MULTI` request: `wr_cnt` (u64), then `wr_cnt` entries (a request
    /// padded to [`WRITE_MULTI_MAX`] entries, as a fixed-size C struct would be, is accepted too).
    pub fn parse_request(p: &[u8]) -> Result<Vec<Self>, ProtoError> {
        let mut r = Reader::new(p);
        let n = r.u64()?;
        if n > WRITE_MULTI_MAX as u64 {
            return Err(ProtoError::LengthMismatch {
                what: "REGION_WRITE_MULTI wr_cnt",
                declared: n,
                present: WRITE_MULTI_MAX as u64,
            });
        }
        let exact = 8 + n as usize * Self::LEN;
        if p.len() != exact && p.len() != 8 + WRITE_MULTI_MAX * Self::LEN {
            return Err(ProtoError::LengthMismatch {
                what: "REGION_WRITE_MULTI size",
                declared: exact as u64,
                present: p.len() as u64,
            });
        }
        (0..n).map(|_| Self::read_fields(&mut r)).collect()
    }

    /// Encodes a `REGION_WRITE_MULTI` request of at most [`WRITE_MULTI_MAX`] writes (the rest
    /// are left out).
    pub fn request(writes: &[Self]) -> Vec<u8> {
        let n = writes.len().min(WRITE_MULTI_MAX);
        let mut v = Vec::with_capacity(8 + n * Self::LEN);
        v.put64(n as u64);
        for w in &writes[..n] {
            w.put_fields(&mut v);
        }
        v
    }
}

impl MigData {
    /// Decodes the fixed part; returns it and the bytes after it.
    pub fn parse(p: &[u8]) -> Result<(Self, &[u8]), ProtoError> {
        with_rest(p, Self::read_fields)
    }

    /// Encodes the fixed part followed by `data`.
    pub fn to_bytes(argsz: u32, size: u32, data: &[u8]) -> Vec<u8> {
        then_data(Self::LEN, |v| MigData { argsz, size }.put_fields(v), data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each layout, byte by byte, against the field tables (offset, size) of the specification.
    #[test]
    fn layouts_match_the_specification_field_tables() {
        let h = Header {
            msg_id: 0x0102,
            command: 17,
            size: 0x2a,
            flags: FLAG_REPLY | FLAG_ERROR,
            error: 22,
        };
        // Message ID @0 (2), Command @2 (2), Message size @4 (4), Flags @8 (4), Error @12 (4).
        assert_eq!(
            h.to_bytes(),
            [2, 1, 17, 0, 0x2a, 0, 0, 0, 0x21, 0, 0, 0, 22, 0, 0, 0]
        );
        assert_eq!(Header::parse(&h.to_bytes(), 64).unwrap(), h);
        // DMA_MAP: argsz @0 (4), flags @4 (4), offset @8 (8), address @16 (8), size @24 (8).
        let m = DmaMap {
            argsz: 32,
            flags: 3,
            offset: 0x1000,
            address: 0x8000_0000,
            size: 0x4000,
        };
        let b = m.to_bytes();
        assert_eq!(b.len(), DmaMap::LEN);
        assert_eq!(&b[0..4], &32u32.to_le_bytes());
        assert_eq!(&b[4..8], &3u32.to_le_bytes());
        assert_eq!(&b[8..16], &0x1000u64.to_le_bytes());
        assert_eq!(&b[16..24], &0x8000_0000u64.to_le_bytes());
        assert_eq!(&b[24..32], &0x4000u64.to_le_bytes());
        assert_eq!(DmaMap::parse(&b).unwrap(), m);
        // DMA_UNMAP: argsz @0, flags @4, address @8 (8), size @16 (8).
        let u = DmaUnmap {
            argsz: 24,
            flags: 0,
            address: 0x8000_0000,
            size: 0x4000,
        };
        let b = u.to_bytes();
        assert_eq!(&b[8..16], &0x8000_0000u64.to_le_bytes());
        assert_eq!(DmaUnmap::parse(&b).unwrap(), u);
        // REGION_READ/WRITE: offset @0 (8), region @8 (4), count @12 (4), data @16.
        let a = RegionAccess {
            offset: 0x78000,
            region: 0,
            count: 4,
        };
        let b = a.to_bytes(&[1, 2, 3, 4]);
        assert_eq!(&b[0..8], &0x78000u64.to_le_bytes());
        assert_eq!(&b[12..16], &4u32.to_le_bytes());
        assert_eq!(&b[16..], &[1, 2, 3, 4]);
        // DEVICE_FEATURE: argsz @0 (4), flags @4 (4), data @8; MIG_DEVICE_STATE data:
        // device_state @0 (4), data_fd @4 (4).
        let mut state = Vec::new();
        state.put32(6); // PRE_COPY
        state.put32(u32::MAX); // data_fd -1: vfio-user moves data over the socket
        let b = Feature::to_bytes(FEATURE_SET | FEATURE_MIG_DEVICE_STATE, &state);
        assert_eq!(&b[0..4], &16u32.to_le_bytes());
        assert_eq!(&b[4..8], &0x2_0002u32.to_le_bytes());
        assert_eq!(&b[8..12], &6u32.to_le_bytes());
        let (f, data) = Feature::parse(&b).unwrap();
        assert_eq!((f.index(), data.len()), (FEATURE_MIG_DEVICE_STATE, 8));
        // MIG_DATA_READ/WRITE: argsz @0 (4), size @4 (4), data @8.
        let b = MigData::to_bytes(12, 4, &[9, 9, 9, 9]);
        assert_eq!(&b[0..8], &[12, 0, 0, 0, 4, 0, 0, 0]);
        let (md, rest) = MigData::parse(&b).unwrap();
        assert_eq!((md.argsz, md.size, rest), (12, 4, &[9u8, 9, 9, 9][..]));
        // DMA_READ/WRITE: address @0 (8), count @8 (8), data @16.
        let b = DmaAccess {
            address: 0x1_2345_6000,
            count: 3,
        }
        .to_bytes(&[7, 8, 9]);
        assert_eq!(&b[0..8], &0x1_2345_6000u64.to_le_bytes());
        assert_eq!(&b[8..16], &3u64.to_le_bytes());
        assert_eq!(&b[16..], &[7, 8, 9]);
        // GET_REGION_INFO (struct vfio_region_info): argsz @0, flags @4, index @8,
        // cap_offset @12, size @16 (8), offset @24 (8); the sparse-mmap capability after it:
        // id @0 (2) = 1, version @2 (2) = 1, next @4 (4), nr_areas @8, reserved @12, areas
        // {offset, size} (16 each) @16.
        let caps = sparse_mmap_cap(&[SparseArea {
            offset: 0x1000,
            size: 0x2000,
        }]);
        let ri = RegionInfo {
            argsz: 64,
            flags: 15,
            index: 2,
            cap_offset: 32,
            size: 0x4000,
            offset: 0x10_0000,
        };
        let b = ri.to_bytes(&caps);
        assert_eq!(b.len(), 64);
        assert_eq!(&b[8..12], &2u32.to_le_bytes());
        assert_eq!(&b[12..16], &32u32.to_le_bytes());
        assert_eq!(&b[16..24], &0x4000u64.to_le_bytes());
        assert_eq!(&b[24..32], &0x10_0000u64.to_le_bytes());
        assert_eq!(&b[32..40], &[1, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(&b[40..44], &1u32.to_le_bytes());
        assert_eq!(&b[48..56], &0x1000u64.to_le_bytes());
        assert_eq!(&b[56..64], &0x2000u64.to_le_bytes());
        assert_eq!(
            parse_sparse_mmap(&b, 32).unwrap().unwrap(),
            [SparseArea {
                offset: 0x1000,
                size: 0x2000
            }]
        );
        // GET_REGION_IO_FDS: argsz @0, flags @4, index @8, count @12; each sub-region:
        // offset @0 (8), size @8 (8), fd_index @16, type @20, flags @24, padding @28,
        // datamatch @32 (8).
        let e = IoFdEntry {
            offset: 0x200,
            size: 4,
            fd_index: 1,
            kind: IO_FD_IOEVENTFD,
            flags: IO_FD_DATAMATCH,
            padding: 0,
            datamatch: 0xdead,
        };
        let b = IoFdsHead {
            argsz: 56,
            flags: 0,
            index: 0,
            count: 1,
        }
        .to_bytes(&[e]);
        assert_eq!(b.len(), 56);
        assert_eq!(&b[12..16], &1u32.to_le_bytes());
        assert_eq!(&b[16..24], &0x200u64.to_le_bytes());
        assert_eq!(&b[32..36], &1u32.to_le_bytes());
        assert_eq!(&b[40..44], &1u32.to_le_bytes());
        assert_eq!(&b[48..56], &0xdeadu64.to_le_bytes());
        assert_eq!(IoFdEntry::parse_all(&b[16..], 1).unwrap(), [e]);
        // REGION_WRITE_MULTI: wr_cnt @0 (8), then entries: offset @0 (8), region @8, count @12,
        // data @16 (8).
        let w = WriteMultiEntry {
            offset: 0x40,
            region: 0,
            count: 4,
            data: 0x1122_3344,
        };
        let b = WriteMultiEntry::request(&[w]);
        assert_eq!(b.len(), 32);
        assert_eq!(&b[0..8], &1u64.to_le_bytes());
        assert_eq!(&b[8..16], &0x40u64.to_le_bytes());
        assert_eq!(&b[20..24], &4u32.to_le_bytes());
        assert_eq!(&b[24..32], &0x1122_3344u64.to_le_bytes());
        assert_eq!(WriteMultiEntry::parse_request(&b).unwrap(), [w]);
    }

    #[test]
    fn capability_chains_that_loop_point_back_or_overrun_are_refused() {
        let ri = RegionInfo {
            argsz: 64,
            flags: 15,
            index: 0,
            cap_offset: 32,
            size: 0,
            offset: 0,
        };
        // An unknown capability whose `next` points at itself.
        let mut cap = Vec::new();
        cap.put16(99);
        cap.put16(1);
        cap.put32(32);
        let b = ri.to_bytes(&cap);
        assert!(parse_sparse_mmap(&b, 32).is_err());
        // An offset inside the fixed part, one past the end, a count past the areas present.
        assert!(parse_sparse_mmap(&b, 8).is_err());
        assert!(parse_sparse_mmap(&b, 1000).is_err());
        let mut caps = sparse_mmap_cap(&[SparseArea { offset: 0, size: 1 }]);
        caps[8] = 2; // nr_areas 2, one present
        assert!(parse_sparse_mmap(&ri.to_bytes(&caps), 32).is_err());
        // An unknown capability first, then the sparse one: found.
        let mut cap = Vec::new();
        cap.put16(99);
        cap.put16(1);
        cap.put32(40);
        cap.extend_from_slice(&sparse_mmap_cap(&[SparseArea { offset: 0, size: 1 }]));
        let found = parse_sparse_mmap(&ri.to_bytes(&cap), 32).unwrap().unwrap();
        assert_eq!(found.len(), 1);
    }

    #[test]
    fn commands_round_trip_and_unknown_ones_are_refused() {
        for n in [1u16, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17, 18] {
            assert_eq!(Command::try_from(n).unwrap() as u16, n);
        }
        for n in [0u16, 14, 19, 0xffff] {
            assert_eq!(Command::try_from(n), Err(ProtoError::UnknownCommand(n)));
        }
    }

    #[test]
    fn headers_with_impossible_sizes_are_refused() {
        let mut h = Header {
            msg_id: 1,
            command: 1,
            size: 15,
            flags: 0,
            error: 0,
        };
        assert!(matches!(
            Header::parse(&h.to_bytes(), 4096),
            Err(ProtoError::BadSize { .. })
        ));
        h.size = 4097;
        assert!(matches!(
            Header::parse(&h.to_bytes(), 4096),
            Err(ProtoError::BadSize { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn no_payload_panics_any_decoder(p in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = DmaMap::parse(&p);
            let _ = DmaUnmap::parse(&p);
            let _ = RegionAccess::parse(&p);
            let _ = Feature::parse(&p);
            let _ = MigData::parse(&p);
            let _ = RegionInfo::parse(&p);
            let _ = DmaAccess::parse(&p);
            let _ = IoFdsHead::parse(&p);
            let _ = WriteMultiEntry::parse_request(&p);
            for cap_offset in [0u32, 32, 40, 48] {
                let _ = parse_sparse_mmap(&p, cap_offset);
            }
            let _ = IoFdEntry::parse_all(&p, p.first().copied().unwrap_or(0).into());
            if let Ok(b) = <[u8; HEADER_LEN]>::try_from(p.get(..HEADER_LEN).unwrap_or(&[])) {
                let _ = Header::parse(&b, 1 << 20);
            }
        }
    }
}
