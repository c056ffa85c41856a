//! The fixed parts of the per-command messages (DMA map and unmap, region access and info, DMA
//! access, IO fds, write-multi, migration data), each with its decoder and encoder.

use super::codec::{then_data, wire_struct, with_rest, Field, ProtoError, Put, Reader};

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
        /// Flags: `VFIO_DMA_UNMAP_FLAG_ALL` (bit 1, every region; address and size 0) or none.
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
