//! Reading AUB packets into events.

use super::consts::{
    engine_index, gen_of_device, reg, subop, ADDRESS_MASK, ENGINE_BASES, GGTT_ENTRIES,
    OPCODE_LEGACY, OPCODE_MEM_TRACE, PAGE_SIZE, TYPE_AUB,
};
use super::error::{AubError, AubSpace, MemFault, Result};
use super::image::{dwords_of, MemoryImage};
use super::model::{AubCapture, ReadLimits};
use super::submission::{submission_from_image, Submission};
use crate::{Engine, Gen, GgttOffset};

// ------------------------------------------------------------------------------------------------
// Reader
// ------------------------------------------------------------------------------------------------

/// One packet's effect, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AubEvent {
    /// `MEM_TRACE_VERSION`.
    Version {
        /// Byte offset of the packet.
        offset: usize,
        /// Device (simulator) id.
        device: u32,
        /// The generation of that device, if known.
        gen: Option<Gen>,
        /// Application name (and PCI id) text.
        app_name: String,
    },
    /// `MEMORY_WRITE`.
    MemoryWrite {
        /// Byte offset of the packet.
        offset: usize,
        /// Address space.
        space: AubSpace,
        /// Address (48-bit).
        addr: u64,
        /// Length in bytes.
        len: u32,
    },
    /// `REGISTER_WRITE` (execlist-port writes included).
    RegisterWrite {
        /// Byte offset of the packet.
        offset: usize,
        /// Register.
        reg: u32,
        /// Value.
        value: u32,
    },
    /// `REGISTER_POLL`.
    RegisterPoll {
        /// Byte offset of the packet.
        offset: usize,
        /// Register.
        reg: u32,
        /// Mask (low dword).
        mask: u32,
        /// Awaited value.
        value: u32,
    },
    /// A context was submitted (follows the register write that submitted it).
    Submit {
        /// Byte offset of the packet.
        offset: usize,
        /// The submission.
        submission: Submission,
    },
    /// A memtrace packet that changes nothing (comments, polls of memory, markers).
    Skipped {
        /// Byte offset of the packet.
        offset: usize,
        /// DW0.
        dw0: u32,
    },
}

#[derive(Clone, Copy, Debug, Default)]
struct PortState {
    elsp: [u32; 4],
    elsp_count: usize,
    sq_lo: u32,
    sq_hi: u32,
}

/// A lazy, total reader of AUB bytes: `next_event` yields one packet's effect at a time and keeps the
/// memory image, registers and submissions current; after an error it yields nothing more.
#[derive(Debug)]
pub struct AubReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    done: bool,
    limits: ReadLimits,
    capture: AubCapture,
    ports: [PortState; 4],
    pending: Vec<AubEvent>,
}

impl<'a> AubReader<'a> {
    /// A reader over `bytes` with the default [`ReadLimits`].
    #[must_use]
    pub fn new(bytes: &'a [u8]) -> Self {
        Self::with_limits(bytes, ReadLimits::default())
    }

    /// A reader with explicit limits.
    #[must_use]
    pub fn with_limits(bytes: &'a [u8], limits: ReadLimits) -> Self {
        Self {
            bytes,
            pos: 0,
            done: false,
            limits,
            capture: AubCapture::default(),
            ports: [PortState::default(); 4],
            pending: Vec::new(),
        }
    }

    /// The memory image as the packets read so far leave it.
    #[must_use]
    pub fn image(&self) -> &MemoryImage {
        &self.capture.memory
    }

    /// The capture as the packets read so far leave it.
    #[must_use]
    pub fn capture(&self) -> &AubCapture {
        &self.capture
    }

    /// The capture read so far, giving up the reader.
    #[must_use]
    pub fn into_capture(self) -> AubCapture {
        self.capture
    }

    /// Byte offset of the next packet.
    #[must_use]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The next event, `Ok(None)` at the end of the file; after an error, always `Ok(None)`.
    ///
    /// # Errors
    /// An [`AubError`] naming the offending packet's byte offset.
    pub fn next_event(&mut self) -> Result<Option<AubEvent>> {
        if !self.pending.is_empty() {
            return Ok(Some(self.pending.remove(0)));
        }
        if self.done {
            return Ok(None);
        }
        match self.step() {
            Ok(ev) => {
                if ev.is_none() {
                    self.done = true;
                }
                Ok(ev)
            }
            Err(e) => {
                self.done = true;
                self.pending.clear();
                Err(e)
            }
        }
    }

    fn step(&mut self) -> Result<Option<AubEvent>> {
        let offset = self.pos;
        let rest = self.bytes.get(offset..).unwrap_or(&[]);
        if rest.is_empty() {
            return Ok(None);
        }
        let have = rest.len() as u64;
        let Some(head) = rest.get(..4) else {
            return Err(AubError::Truncated {
                offset,
                need: 4,
                have,
            });
        };
        let dw0 = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if dw0 >> 29 != TYPE_AUB {
            return Err(AubError::NotAubPacket { offset, dw0 });
        }
        match (dw0 >> 23) & 0x3f {
            OPCODE_MEM_TRACE => {}
            OPCODE_LEGACY => return Err(AubError::LegacyPacket { offset, dw0 }),
            _ => return Err(AubError::UnknownOpcode { offset, dw0 }),
        }
        let dwords = (dw0 & 0xffff) + 1;
        let need = u64::from(dwords) * 4;
        let Some(packet) = rest.get(..need as usize) else {
            return Err(AubError::Truncated { offset, need, have });
        };
        self.pos = offset + need as usize;
        let p = dwords_of(packet);
        let at = |i: usize| p.get(i).copied().unwrap_or(0);
        let short = |min: u32| {
            if dwords < min {
                Err(AubError::PacketTooShort {
                    offset,
                    dw0,
                    dwords,
                    min,
                })
            } else {
                Ok(())
            }
        };
        let ev = match (dw0 >> 16) & 0x7f {
            subop::VERSION => {
                short(5)?;
                let device = (at(2) >> 8) & 0xff;
                let gen = gen_of_device(device);
                let name = packet.get(20..).unwrap_or(&[]);
                let end = name
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(name.len())
                    .min(256);
                let app_name = String::from_utf8_lossy(&name[..end]).into_owned();
                self.capture.gen = gen;
                self.capture.app_name.clone_from(&app_name);
                AubEvent::Version {
                    offset,
                    device,
                    gen,
                    app_name,
                }
            }
            subop::MEMORY_WRITE => {
                short(5)?;
                let addr = (u64::from(at(1)) | (u64::from(at(2)) << 32)) & ADDRESS_MASK;
                let space_bits = at(3) >> 28;
                let len = at(4);
                let room = packet.len().saturating_sub(20);
                let data = (len as usize)
                    .checked_add(20)
                    .and_then(|end| packet.get(20..end))
                    .ok_or(AubError::WriteTooLong {
                        offset,
                        len,
                        room: room as u32,
                    })?;
                let max_pages = self.limits.max_pages;
                let mem = &mut self.capture.memory;
                let space = match space_bits {
                    0 => {
                        mem.write_ggtt(GgttOffset(addr), data, max_pages)
                            .map_err(|fault| AubError::Memory { offset, fault })?;
                        AubSpace::Ggtt
                    }
                    2 => {
                        mem.write_phys(addr, data, max_pages)
                            .map_err(|fault| AubError::Memory { offset, fault })?;
                        AubSpace::Physical
                    }
                    4 => {
                        if !addr.is_multiple_of(8) || len % 8 != 0 {
                            return Err(AubError::MisalignedEntryWrite { offset, addr, len });
                        }
                        let first = addr / 8;
                        let count = u64::from(len / 8);
                        if first.saturating_add(count) > GGTT_ENTRIES {
                            return Err(AubError::Memory {
                                offset,
                                fault: MemFault::GgttOutOfRange {
                                    addr: first.saturating_add(count).saturating_mul(PAGE_SIZE),
                                },
                            });
                        }
                        for (i, e) in data.chunks_exact(8).enumerate() {
                            let pte = u64::from_le_bytes([
                                e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7],
                            ]);
                            mem.set_ggtt_entry(first + i as u64, pte)
                                .map_err(|fault| AubError::Memory { offset, fault })?;
                        }
                        AubSpace::GgttEntry
                    }
                    space => return Err(AubError::UnsupportedSpace { offset, space }),
                };
                AubEvent::MemoryWrite {
                    offset,
                    space,
                    addr,
                    len,
                }
            }
            subop::REGISTER_WRITE => {
                short(6)?;
                let (reg, value) = (at(1), at(5));
                self.register_write(offset, reg, value)?;
                AubEvent::RegisterWrite { offset, reg, value }
            }
            subop::REGISTER_POLL => {
                short(6)?;
                AubEvent::RegisterPoll {
                    offset,
                    reg: at(1),
                    mask: at(3),
                    value: at(5),
                }
            }
            // Version (old), register/memory compare, memory poll, frame begin, comment, delay,
            // memory dump, test-phase marker, continuous region, predicate, dump compress: none
            // changes memory, registers or submissions.
            0x00
            | 0x01
            | 0x04
            | 0x05
            | 0x07
            | subop::COMMENT
            | 0x09
            | 0x0a
            | 0x0c
            | 0x0d
            | 0x0f
            | 0x10 => AubEvent::Skipped { offset, dw0 },
            // MEMORY_WRITE_DISCONTIGUOUS (0x0b) and anything unknown might change memory: refusing
            // is sound, skipping is not.
            _ => return Err(AubError::UnsupportedPacket { offset, dw0 }),
        };
        Ok(Some(ev))
    }

    fn register_write(&mut self, offset: usize, reg: u32, value: u32) -> Result<()> {
        for (engine, base) in ENGINE_BASES {
            let port = &mut self.ports[engine_index(engine)];
            let Some(rel) = reg.checked_sub(base) else {
                continue;
            };
            match rel {
                reg::EXECLIST_SUBMITPORT => {
                    port.elsp[port.elsp_count] = value;
                    port.elsp_count += 1;
                    if port.elsp_count == 4 {
                        port.elsp_count = 0;
                        let e = port.elsp;
                        let element0 = (u64::from(e[2]) << 32) | u64::from(e[3]);
                        let element1 = (u64::from(e[0]) << 32) | u64::from(e[1]);
                        self.submit(offset, engine, element0)?;
                        if element1 & 1 != 0 {
                            self.submit(offset, engine, element1)?;
                        }
                    }
                    return Ok(());
                }
                reg::EXECLIST_SQ_CONTENTS => {
                    port.sq_lo = value;
                    return Ok(());
                }
                r if r == reg::EXECLIST_SQ_CONTENTS + 4 => {
                    port.sq_hi = value;
                    return Ok(());
                }
                reg::EXECLIST_CONTROL => {
                    let desc = (u64::from(port.sq_hi) << 32) | u64::from(port.sq_lo);
                    if value & 1 != 0 {
                        self.submit(offset, engine, desc)?;
                    }
                    return Ok(());
                }
                _ => {}
            }
        }
        let regs = &mut self.capture.registers;
        if !regs.contains_key(&reg) && regs.len() >= self.limits.max_registers {
            return Err(AubError::TooManyRegisters {
                offset,
                limit: self.limits.max_registers,
            });
        }
        regs.insert(reg, value);
        Ok(())
    }

    fn submit(&mut self, offset: usize, engine: Engine, descriptor: u64) -> Result<()> {
        if self.capture.submissions.len() >= self.limits.max_submissions {
            return Err(AubError::TooManySubmissions {
                offset,
                limit: self.limits.max_submissions,
            });
        }
        let submission =
            submission_from_image(&self.capture.memory, engine, descriptor).map_err(|fault| {
                AubError::ContextUnreadable {
                    offset,
                    descriptor,
                    fault,
                }
            })?;
        self.capture.submissions.push(submission);
        self.pending.push(AubEvent::Submit { offset, submission });
        Ok(())
    }
}
