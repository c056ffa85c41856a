//! The virtual DP monitor's side of the AUX channel: native reads and writes of its DPCD, and
//! I2C-over-AUX reads of its EDID at address 0x50 (what drm's `drm_dp_i2c_xfer` sends), as
//! GVT-g's `handlers.c` and `edid.c` answer them.
//!
//! A request is the message i915 packs into `DP_AUX_CH_DATA1..5`: byte 0 holds the command in
//! bits 7:4 and address bits 19:16 in bits 3:0, bytes 1-2 the address, byte 3 the length less
//! one (absent in an address-only I2C message), then the data of a write. The reply's byte 0 is
//! the reply code (0 ACK; native NACK 0x10, I2C NACK 0x40), then the data of a read.

use serde::{Deserialize, Serialize};

use super::edid;

/// AUX commands (request byte 0, bits 7:4).
const NATIVE_WRITE: u8 = 0x8;
const NATIVE_READ: u8 = 0x9;
/// I2C-over-AUX: bit 2 is "middle of transaction", bits 1:0 the operation.
const I2C_MOT: u8 = 0x4;
const I2C_READ: u8 = 0x1;
/// Reply codes.
const ACK: u8 = 0x00;
const NATIVE_NACK: u8 = 0x10;
const I2C_NACK: u8 = 0x40;
/// The EDID's I2C address and the E-DDC segment pointer's.
const EDID_I2C_ADDR: u8 = 0x50;
const SEGMENT_I2C_ADDR: u8 = 0x30;
/// Largest AUX payload.
pub const MAX_PAYLOAD: usize = 16;
/// DPCD addresses the sink implements; reads beyond answer zeros, as a sink does for an
/// unsupported address.
const DPCD_SIZE: u32 = 0x1000;

/// The DPCD receiver capabilities (0x000-0x00f): DPCD 1.2, HBR2 (5.4 Gbit/s), four lanes with
/// enhanced framing, 0.5% down-spread, one receiver port, 8b/10b coding.
const DPCD_CAPS: [u8; 16] = [
    0x12, 0x14, 0x84, 0x01, 0x01, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
];
/// DPCD link and sink status (0x200-0x207): one sink; every lane has clock recovery, channel
/// equalisation and symbol lock, interlane alignment is done: a virtual link trains at once.
const DPCD_STATUS: [u8; 8] = [0x01, 0x00, 0x77, 0x77, 0x01, 0x03, 0x00, 0x00];

/// The AUX channel's state: the I2C-over-AUX transaction and the DPCD bytes the source wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuxState {
    /// DPCD bytes written by the source (link configuration, power state).
    pub dpcd: std::collections::BTreeMap<u32, u8>,
    /// The I2C device addressed by the transaction in progress (0: none).
    pub i2c_addr: u8,
    /// The EDID byte the next I2C read returns.
    pub edid_offset: u8,
}

/// A malformed request (never from i915; a guest may send anything).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuxError {
    /// Fewer than three bytes, or a length byte longer than the payload limit.
    #[error("malformed AUX request of {0} bytes")]
    Malformed(usize),
}

impl AuxState {
    /// Answers one request with the monitor's `edid`: the reply bytes (at most 17).
    pub fn transaction(&mut self, req: &[u8], edid: &[u8]) -> Result<Vec<u8>, AuxError> {
        if req.len() < 3 {
            return Err(AuxError::Malformed(req.len()));
        }
        let cmd = req[0] >> 4;
        let addr = (u32::from(req[0] & 0xf) << 16) | (u32::from(req[1]) << 8) | u32::from(req[2]);
        let len = match req.get(3) {
            Some(&l) => usize::from(l) + 1,
            None => 0,
        };
        if len > MAX_PAYLOAD {
            return Err(AuxError::Malformed(req.len()));
        }
        let data = req.get(4..).unwrap_or(&[]);
        Ok(match cmd {
            NATIVE_READ => {
                let mut r = vec![ACK];
                r.extend((addr..addr + len as u32).map(|a| self.dpcd_byte(a)));
                r
            }
            NATIVE_WRITE => {
                if addr + (data.len() as u32) > DPCD_SIZE {
                    return Ok(vec![NATIVE_NACK]);
                }
                for (a, &b) in (addr..).zip(data) {
                    // Capabilities and status are the sink's: writes there are dropped.
                    if !(0x000..0x100).contains(&a) && !(0x200..0x300).contains(&a) {
                        self.dpcd.insert(a, b);
                    }
                }
                vec![ACK]
            }
            c if c & 0x8 == 0 => self.i2c(c, (addr & 0x7f) as u8, len, data, edid),
            _ => vec![NATIVE_NACK],
        })
    }

    /// The DPCD byte at `addr` as the sink answers a read.
    pub fn dpcd_byte(&self, addr: u32) -> u8 {
        match addr {
            0x000..=0x00f => DPCD_CAPS[addr as usize],
            0x200..=0x207 => DPCD_STATUS[(addr - 0x200) as usize],
            _ => self.dpcd.get(&addr).copied().unwrap_or(0),
        }
    }

    fn i2c(&mut self, cmd: u8, dev: u8, len: usize, data: &[u8], edid: &[u8]) -> Vec<u8> {
        let present = matches!(dev, EDID_I2C_ADDR | SEGMENT_I2C_ADDR);
        if !present {
            self.i2c_addr = 0;
            return vec![I2C_NACK];
        }
        self.i2c_addr = if cmd & I2C_MOT != 0 { dev } else { 0 };
        if len == 0 {
            // Address only: a start (MOT) or the stop that ends the transaction.
            return vec![ACK];
        }
        if cmd & 0x3 == I2C_READ {
            let mut r = vec![ACK];
            for _ in 0..len {
                let b = if dev == EDID_I2C_ADDR {
                    edid.get(usize::from(self.edid_offset))
                        .copied()
                        .unwrap_or(0xff)
                } else {
                    0
                };
                r.push(b);
                if dev == EDID_I2C_ADDR {
                    self.edid_offset = self.edid_offset.wrapping_add(1);
                }
            }
            return r;
        }
        // A write: the EDID's word offset (the segment pointer is accepted and ignored: the
        // EDID has one block).
        if dev == EDID_I2C_ADDR {
            if let Some(&o) = data.first() {
                self.edid_offset = o;
            }
        }
        vec![ACK]
    }
}

/// The EDID a monitor of `res` answers.
pub fn edid_for(res: edid::Resolution) -> [u8; edid::EDID_LEN] {
    edid::generate(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edid() -> [u8; 128] {
        edid_for(edid::Resolution::WUXGA)
    }

    #[test]
    fn native_reads_answer_the_receiver_caps_and_zeros_beyond() {
        let mut a = AuxState::default();
        // DPCD read of 16 bytes at 0: 0x90 00 00 0f.
        let r = a.transaction(&[0x90, 0x00, 0x00, 0x0f], &edid()).unwrap();
        assert_eq!(r[0], ACK);
        assert_eq!(&r[1..], &DPCD_CAPS);
        // LTTPR capabilities at 0xf0000: zeros (no repeater).
        let r = a.transaction(&[0x9f, 0x00, 0x00, 0x07], &edid()).unwrap();
        assert_eq!(r, [0u8; 9].map(|_| 0).to_vec());
        // Link status: trained.
        let r = a.transaction(&[0x90, 0x02, 0x02, 0x02], &edid()).unwrap();
        assert_eq!(r, vec![ACK, 0x77, 0x77, 0x01]);
    }

    #[test]
    fn native_writes_configure_the_link_and_read_back() {
        let mut a = AuxState::default();
        // DP_LINK_BW_SET, DP_LANE_COUNT_SET = 0x06, 0x84.
        let r = a
            .transaction(&[0x80, 0x01, 0x00, 0x01, 0x06, 0x84], &edid())
            .unwrap();
        assert_eq!(r, vec![ACK]);
        let r = a.transaction(&[0x90, 0x01, 0x00, 0x01], &edid()).unwrap();
        assert_eq!(r, vec![ACK, 0x06, 0x84]);
        // Capabilities are the sink's.
        a.transaction(&[0x80, 0x00, 0x00, 0x00, 0xff], &edid())
            .unwrap();
        assert_eq!(a.dpcd_byte(0), 0x12);
        // Beyond the DPCD: NACK.
        assert_eq!(
            a.transaction(&[0x8f, 0xff, 0xff, 0x00, 0x00], &edid())
                .unwrap(),
            vec![NATIVE_NACK]
        );
    }

    #[test]
    fn i2c_over_aux_reads_the_edid_in_chunks_as_drm_does() {
        let mut a = AuxState::default();
        let e = edid();
        // Start with MOT to 0x50, write offset 0, read 128 bytes 16 at a time, stop.
        assert_eq!(a.transaction(&[0x40, 0x00, 0x50], &e).unwrap(), vec![ACK]);
        assert_eq!(
            a.transaction(&[0x40, 0x00, 0x50, 0x00, 0x00], &e).unwrap(),
            vec![ACK]
        );
        let mut got = Vec::new();
        for _ in 0..8 {
            let r = a.transaction(&[0x50, 0x00, 0x50, 0x0f], &e).unwrap();
            assert_eq!(r[0], ACK);
            got.extend_from_slice(&r[1..]);
        }
        assert_eq!(a.transaction(&[0x10, 0x00, 0x50], &e).unwrap(), vec![ACK]);
        assert_eq!(got, e.to_vec());
        assert_eq!(a.i2c_addr, 0, "the stop ended the transaction");
        edid::parse_preferred(&got).unwrap();
        // A device that is not there: NACK.
        assert_eq!(
            a.transaction(&[0x50, 0x00, 0x37, 0x00], &e).unwrap(),
            vec![I2C_NACK]
        );
    }

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        let mut a = AuxState::default();
        assert_eq!(a.transaction(&[0x90], &edid()), Err(AuxError::Malformed(1)));
        // A native read of the whole 20-bit space near its end stays in range.
        let r = a.transaction(&[0x9f, 0xff, 0xff, 0x0f], &edid()).unwrap();
        assert_eq!(r.len(), 17);
    }
}
