//! Control frames: the replies and the commit that travel beside the stream.

use std::io::{self, Read, Write};

use super::error::{Result, StreamError};
use super::reader::read_exact_at;
use super::wire::section_crc;

/// Messages the two ends exchange beside the stream (replies, the commit).
///
/// Frame: magic `b"GMCT"`, kind u16, reserved u16, payload length u32, CRC-32 of
/// (the first 12 bytes ++ payload), payload (at most [`Control::MAX_PAYLOAD`] bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Destination → source: the header is compatible; send the rest.
    HeaderAccepted,
    /// Destination → source: the stream was refused; the reason in words.
    Rejected(String),
    /// Destination → source: every section validated and the vGPU restored (not yet running).
    Restored,
    /// Source → destination: the source has given up the vGPU; run it.
    Commit,
    /// Destination → source: the vGPU runs; how long restore and remap took.
    Resumed {
        /// Restore time (state sections applied), nanoseconds.
        restore_ns: u64,
        /// GGTT remap time, nanoseconds.
        remap_ns: u64,
    },
    /// Source → destination: the migration is called off and the source runs the vGPU again;
    /// drop everything received. The reason in words.
    Aborted(String),
    /// Destination → source: every stream byte up to the SYNC section with this sequence number
    /// is applied (the switch-over acknowledgement: the source stops the vGPU only after it, so
    /// the downtime does not absorb a backlog of pre-copy data still being applied).
    Synced(u64),
}

/// Magic of a control frame.
pub const CONTROL_MAGIC: [u8; 4] = *b"GMCT";
const CONTROL_HEADER_LEN: usize = 16;

impl Control {
    /// Largest control payload accepted.
    pub const MAX_PAYLOAD: u32 = 4096;

    fn kind(&self) -> u16 {
        match self {
            Control::HeaderAccepted => 1,
            Control::Rejected(_) => 2,
            Control::Restored => 3,
            Control::Commit => 4,
            Control::Resumed { .. } => 5,
            Control::Aborted(_) => 6,
            Control::Synced(_) => 7,
        }
    }

    /// Write the frame.
    pub fn write_to<W: Write>(&self, w: &mut W) -> io::Result<()> {
        let payload: Vec<u8> = match self {
            Control::Rejected(msg) | Control::Aborted(msg) => {
                let mut end = msg.len().min(Self::MAX_PAYLOAD as usize);
                while !msg.is_char_boundary(end) {
                    end -= 1;
                }
                msg.as_bytes()[..end].to_vec()
            }
            Control::Resumed {
                restore_ns,
                remap_ns,
            } => {
                let mut p = restore_ns.to_le_bytes().to_vec();
                p.extend_from_slice(&remap_ns.to_le_bytes());
                p
            }
            Control::Synced(seq) => seq.to_le_bytes().to_vec(),
            _ => Vec::new(),
        };
        let mut frame = Vec::with_capacity(CONTROL_HEADER_LEN + payload.len());
        frame.extend_from_slice(&CONTROL_MAGIC);
        frame.extend_from_slice(&self.kind().to_le_bytes());
        frame.extend_from_slice(&0u16.to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let crc = section_crc(&frame[..12], &payload);
        frame.extend_from_slice(&crc.to_le_bytes());
        frame.extend_from_slice(&payload);
        w.write_all(&frame)?;
        w.flush()
    }

    /// Read and validate one frame.
    pub fn read_from<R: Read>(r: &mut R) -> Result<Self> {
        let mut head = [0u8; CONTROL_HEADER_LEN];
        read_exact_at(r, &mut head, 0)?;
        let bad = |reason, value| StreamError::BadControl { reason, value };
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        if head[..4] != CONTROL_MAGIC {
            return Err(bad("bad magic", u64::from(word(0))));
        }
        let kind = u16::from_le_bytes([head[4], head[5]]);
        let reserved = u16::from_le_bytes([head[6], head[7]]);
        if reserved != 0 {
            return Err(bad("reserved field is not zero", reserved.into()));
        }
        let len = word(8);
        if len > Self::MAX_PAYLOAD {
            return Err(bad("payload too large", len.into()));
        }
        let mut payload = vec![0u8; len as usize];
        read_exact_at(r, &mut payload, CONTROL_HEADER_LEN as u64)?;
        let computed = section_crc(&head[..12], &payload);
        if computed != word(12) {
            return Err(bad("checksum mismatch", computed.into()));
        }
        let empty = |c: Control| {
            if payload.is_empty() {
                Ok(c)
            } else {
                Err(bad("unexpected payload", payload.len() as u64))
            }
        };
        match kind {
            1 => empty(Control::HeaderAccepted),
            2 => Ok(Control::Rejected(
                String::from_utf8_lossy(&payload).into_owned(),
            )),
            3 => empty(Control::Restored),
            4 => empty(Control::Commit),
            5 => {
                let (a, b) = payload
                    .split_first_chunk::<8>()
                    .ok_or(bad("Resumed payload too short", len.into()))?;
                let b: [u8; 8] = b
                    .try_into()
                    .map_err(|_| bad("Resumed payload has the wrong length", len.into()))?;
                Ok(Control::Resumed {
                    restore_ns: u64::from_le_bytes(*a),
                    remap_ns: u64::from_le_bytes(b),
                })
            }
            6 => Ok(Control::Aborted(
                String::from_utf8_lossy(&payload).into_owned(),
            )),
            7 => {
                let seq: [u8; 8] = payload
                    .as_slice()
                    .try_into()
                    .map_err(|_| bad("Synced payload has the wrong length", len.into()))?;
                Ok(Control::Synced(u64::from_le_bytes(seq)))
            }
            other => Err(bad("unknown kind", other.into())),
        }
    }
}
