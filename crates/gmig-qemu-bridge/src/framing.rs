//! QEMU's VFIO migration framing: how QEMU's `vfio` device wraps a device's migration data inside
//! its own migration stream. Every marker is a big-endian u64; `DEV_DATA_STATE` is followed by a
//! big-endian u64 size and that many bytes of device data; a section ends with `END_OF_STATE`.
//! [`write_device_data`] frames a gmig device stream the way QEMU does, and [`read_device_data`]
//! recovers it, refusing unknown markers, sizes past a limit and truncation.

use std::io::{self, Read, Write};

/// `VFIO_MIG_FLAG_END_OF_STATE`.
pub const END_OF_STATE: u64 = 0xffff_ffff_ef10_0001;
/// `VFIO_MIG_FLAG_DEV_CONFIG_STATE`.
pub const DEV_CONFIG_STATE: u64 = 0xffff_ffff_ef10_0002;
/// `VFIO_MIG_FLAG_DEV_SETUP_STATE`.
pub const DEV_SETUP_STATE: u64 = 0xffff_ffff_ef10_0003;
/// `VFIO_MIG_FLAG_DEV_DATA_STATE`.
pub const DEV_DATA_STATE: u64 = 0xffff_ffff_ef10_0004;
/// `VFIO_MIG_FLAG_DEV_INIT_DATA_SENT`.
pub const DEV_INIT_DATA_SENT: u64 = 0xffff_ffff_ef10_0005;

/// Errors reading a framed stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FramingError {
    /// The input failed or ended early.
    #[error("reading the framed stream at byte {offset}: {source}")]
    Io {
        /// Bytes consumed before the failure.
        offset: u64,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A marker QEMU does not write.
    #[error("unknown marker 0x{marker:016x} at byte {offset}")]
    UnknownMarker {
        /// The marker.
        marker: u64,
        /// Where it starts.
        offset: u64,
    },
    /// A data chunk larger than the reader allows.
    #[error("data chunk of {size} bytes at byte {offset} exceeds the limit of {limit}")]
    TooLarge {
        /// The declared size.
        size: u64,
        /// Where its size field starts.
        offset: u64,
        /// The limit.
        limit: u64,
    },
}

/// Writes `data` as QEMU frames it in the stop-and-copy section: `DEV_DATA_STATE`, size, bytes
/// (in chunks of at most `chunk` bytes), then `END_OF_STATE`. A `chunk` of 0 writes one chunk.
pub fn write_device_data<W: Write>(out: &mut W, data: &[u8], chunk: usize) -> io::Result<()> {
    let chunk = if chunk == 0 { data.len().max(1) } else { chunk };
    for piece in data.chunks(chunk) {
        out.write_all(&DEV_DATA_STATE.to_be_bytes())?;
        out.write_all(&(piece.len() as u64).to_be_bytes())?;
        out.write_all(piece)?;
    }
    out.write_all(&END_OF_STATE.to_be_bytes())
}

/// Reads one framed section up to its `END_OF_STATE` and returns the device data it carried
/// (config and setup markers carry none and are skipped; `DEV_INIT_DATA_SENT` likewise). The whole
/// section may carry at most `limit` bytes of data.
pub fn read_device_data<R: Read>(input: &mut R, limit: u64) -> Result<Vec<u8>, FramingError> {
    let mut offset = 0u64;
    let mut data = Vec::new();
    let u64_at = |input: &mut R, offset: &mut u64| -> Result<u64, FramingError> {
        let mut b = [0u8; 8];
        input
            .read_exact(&mut b)
            .map_err(|source| FramingError::Io {
                offset: *offset,
                source,
            })?;
        *offset += 8;
        Ok(u64::from_be_bytes(b))
    };
    loop {
        let at = offset;
        match u64_at(input, &mut offset)? {
            END_OF_STATE => return Ok(data),
            DEV_CONFIG_STATE | DEV_SETUP_STATE | DEV_INIT_DATA_SENT => {}
            DEV_DATA_STATE => {
                let size_at = offset;
                let size = u64_at(input, &mut offset)?;
                let total = (data.len() as u64).saturating_add(size);
                if total > limit {
                    return Err(FramingError::TooLarge {
                        size,
                        offset: size_at,
                        limit,
                    });
                }
                let start = data.len();
                data.resize(start + size as usize, 0);
                input
                    .read_exact(&mut data[start..])
                    .map_err(|source| FramingError::Io { offset, source })?;
                offset += size;
            }
            marker => return Err(FramingError::UnknownMarker { marker, offset: at }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_stream_survives_the_framing_in_any_chunking() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        for chunk in [0, 1, 4096, 9_999, 20_000] {
            let mut framed = Vec::new();
            write_device_data(&mut framed, &data, chunk).unwrap();
            assert_eq!(&framed[..8], &DEV_DATA_STATE.to_be_bytes());
            assert_eq!(&framed[framed.len() - 8..], &END_OF_STATE.to_be_bytes());
            assert_eq!(
                read_device_data(&mut framed.as_slice(), 1 << 20).unwrap(),
                data
            );
        }
    }

    #[test]
    fn markers_are_qemus() {
        assert_eq!(END_OF_STATE, 0xffff_ffff_ef10_0001);
        assert_eq!(DEV_DATA_STATE, 0xffff_ffff_ef10_0004);
        let mut framed = DEV_SETUP_STATE.to_be_bytes().to_vec();
        framed.extend_from_slice(&END_OF_STATE.to_be_bytes());
        assert!(read_device_data(&mut framed.as_slice(), 16)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn corrupt_truncated_and_oversized_input_is_refused() {
        let mut framed = Vec::new();
        write_device_data(&mut framed, &[1, 2, 3, 4], 0).unwrap();
        for cut in 0..framed.len() {
            assert!(matches!(
                read_device_data(&mut &framed[..cut], 64),
                Err(FramingError::Io { .. })
            ));
        }
        assert!(matches!(
            read_device_data(&mut framed.as_slice(), 3),
            Err(FramingError::TooLarge { size: 4, .. })
        ));
        let mut bad = framed.clone();
        bad[7] ^= 0xff;
        assert!(matches!(
            read_device_data(&mut bad.as_slice(), 64),
            Err(FramingError::UnknownMarker { offset: 0, .. })
        ));
        // A size that would wrap, or ask for far more than the input holds, allocates nothing.
        let mut huge = DEV_DATA_STATE.to_be_bytes().to_vec();
        huge.extend_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(
            read_device_data(&mut huge.as_slice(), 1 << 20),
            Err(FramingError::TooLarge { .. })
        ));
    }
}
