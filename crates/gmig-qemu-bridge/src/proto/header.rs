//! The 16-byte message header, its flags, and the command numbers.

use super::codec::{ProtoError, Reader};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
