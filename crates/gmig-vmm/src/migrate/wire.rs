//! The whole-VM stream's framing: the magic, record tags, the source's record writer ([`Wire`],
//! paced to an emulated link) and the destination's record reader.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Stream magic.
pub const MAGIC: &[u8; 8] = b"GMIGVM01";
pub(crate) const PAGE: usize = 4096;
/// Pages per PAGES record.
pub const PAGES_PER_RECORD: usize = 256;
/// The largest record payload accepted.
pub const MAX_RECORD: usize = 4 << 20;

/// Record tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Tag {
    /// [`Hello`](super::Hello), first.
    Hello = 1,
    /// Guest pages: `(gfn u64, kind u8 [0 zero, 1 data], 4096 bytes if data)*`.
    Pages = 2,
    /// A chunk of the vGPU's VFIO migration data.
    Device = 3,
    /// The vGPU's PCI configuration space, 256 bytes.
    Config = 4,
    /// [`VcpuState`](crate::kvm::VcpuState) (postcard).
    Vcpu = 5,
    /// [`SerialSnapshot`](crate::machine::SerialSnapshot) (postcard).
    Serial = 6,
    /// End of the stream: the source is paused and has sent everything.
    Done = 7,
}

impl Tag {
    pub(crate) fn from_u8(v: u8) -> Option<Tag> {
        Some(match v {
            1 => Tag::Hello,
            2 => Tag::Pages,
            3 => Tag::Device,
            4 => Tag::Config,
            5 => Tag::Vcpu,
            6 => Tag::Serial,
            7 => Tag::Done,
            _ => return None,
        })
    }
}

/// The source's side of the stream: records, counted, paced to an emulated link.
pub(crate) struct Wire<'a, S: Write> {
    pub(crate) s: &'a mut S,
    pub(crate) bytes: u64,
    pub(crate) rate: Option<f64>,
    pub(crate) start: Instant,
}

impl<S: Write> Wire<'_, S> {
    pub(crate) fn record(&mut self, tag: Tag, payload: &[u8]) -> Result<()> {
        let mut head = [0u8; 9];
        head[0] = tag as u8;
        head[1..5].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        head[5..9].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
        self.s.write_all(&head)?;
        self.s.write_all(payload)?;
        self.bytes += 9 + payload.len() as u64;
        if let Some(gbps) = self.rate {
            // Pace to the emulated link: never ahead of bytes / rate.
            let due = Duration::from_secs_f64(self.bytes as f64 * 8.0 / (gbps * 1e9));
            if let Some(wait) = due.checked_sub(self.start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        Ok(())
    }
}

pub(crate) fn read_record<S: Read>(s: &mut S) -> Result<(Tag, Vec<u8>)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head)?;
    let tag = Tag::from_u8(head[0])
        .ok_or_else(|| Error::Stream(format!("unknown record tag {}", head[0])))?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_RECORD {
        return Err(Error::Stream(format!(
            "{tag:?} record of {len} bytes (limit {MAX_RECORD})"
        )));
    }
    let crc = u32::from_le_bytes([head[5], head[6], head[7], head[8]]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload)?;
    if crc32fast::hash(&payload) != crc {
        return Err(Error::Stream(format!("{tag:?} record fails its CRC")));
    }
    Ok((tag, payload))
}
