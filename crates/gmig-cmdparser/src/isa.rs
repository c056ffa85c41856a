//! Shader kernels: which binding-table entries a GEN8–GEN11 EU kernel may read and write.
//!
//! Only SEND messages touch memory on the EU, so a kernel's memory footprint is the set of
//! messages it sends: their shared function (SFID, DW0 bits 27:24) and, in the 32-bit message
//! descriptor (bits 127:96 when immediate), the binding-table index (bits 7:0) and message type.
//! [`scan_kernel`] walks a kernel from its start to its end-of-thread SEND and classifies every
//! message:
//!
//! - sampler, sampler cache, constant cache, VME and CRE messages read their binding-table entry;
//! - render-cache messages (render-target writes, type 12) write theirs; render-target reads
//!   (type 13) read;
//! - data-cache messages (DC0, DC1) write theirs unless their type is a known read; scratch
//!   messages and stateless indices (255, and 253 on DC0) address the general-state buffer; A64
//!   messages (DC1 with index 253) and bindless surfaces (252) can address anything the
//!   context maps;
//! - URB, gateway, thread-spawner and pixel-interpolator messages touch no memory.
//!
//! What the scan cannot follow makes the kernel's writes "anywhere the context reaches"
//! ([`KernelScan::reach`]) rather than a guess: control flow (a branch may skip the first
//! end-of-thread), a descriptor held in a register, a compacted SEND, an unknown shared function,
//! an unreadable instruction or no end of thread within [`MAX_KERNEL_BYTES`].
//!
//! Facts (bit positions, opcodes, SFIDs, special indices) are from Intel's PRMs as Mesa's
//! `brw_inst.h`, `brw_eu_defines.h` and `brw_eu.h` describe them; no code is carried over.

use std::collections::BTreeSet;

use crate::addr::AddressSpace;
use crate::memory::GpuMemory;
use crate::table::Gen;

/// The most kernel bytes scanned before giving up (4,096 native instructions).
pub const MAX_KERNEL_BYTES: u64 = 64 * 1024;

/// SEND, SENDC (all generations) and SENDS, SENDSC (GEN9–GEN11 split sends).
pub const OP_SEND: u32 = 49;
/// SENDC.
pub const OP_SENDC: u32 = 50;
/// SENDS (GEN9+).
pub const OP_SENDS: u32 = 51;
/// SENDSC (GEN9+).
pub const OP_SENDSC: u32 = 52;
/// NOP.
pub const OP_NOP: u32 = 0x7e;
/// MOV.
pub const OP_MOV: u32 = 0x01;

/// Shared function IDs.
pub mod sfid {
    /// Null.
    pub const NULL: u32 = 0;
    /// Sampler.
    pub const SAMPLER: u32 = 2;
    /// Message gateway.
    pub const GATEWAY: u32 = 3;
    /// Data port sampler cache.
    pub const SAMPLER_CACHE: u32 = 4;
    /// Data port render cache.
    pub const RENDER_CACHE: u32 = 5;
    /// URB.
    pub const URB: u32 = 6;
    /// Thread spawner.
    pub const THREAD_SPAWNER: u32 = 7;
    /// Video motion estimation.
    pub const VME: u32 = 8;
    /// Data port constant cache.
    pub const CONSTANT_CACHE: u32 = 9;
    /// Data port data cache 0.
    pub const DATA_CACHE: u32 = 10;
    /// Pixel interpolator.
    pub const PIXEL_INTERPOLATOR: u32 = 11;
    /// Data port data cache 1.
    pub const DATA_CACHE_1: u32 = 12;
    /// Check and refinement engine.
    pub const CRE: u32 = 13;
}

/// Special binding-table indices.
pub mod bti {
    /// Stateless, IA-coherent (general-state relative on DC0/DC1).
    pub const STATELESS: u8 = 255;
    /// Shared local memory (on-chip).
    pub const SLM: u8 = 254;
    /// Stateless non-coherent on DC0; A64 on DC1.
    pub const STATELESS_NC: u8 = 253;
    /// Bindless (GEN9+; the surface handle is in the extended descriptor).
    pub const BINDLESS: u8 = 252;
}

/// Render-cache message type of a render-target write (descriptor bits 17:14).
pub const RC_RENDER_TARGET_WRITE: u32 = 12;
/// Render-cache message type of a render-target read.
pub const RC_RENDER_TARGET_READ: u32 = 13;

/// What a kernel's messages address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelScan {
    /// Binding-table entries read.
    pub reads: BTreeSet<u8>,
    /// Binding-table entries written.
    pub writes: BTreeSet<u8>,
    /// Whether a message writes through a stateless (general-state) or scratch address.
    pub stateless: bool,
    /// Why the kernel may write anywhere its context maps (the scan could not bound it).
    pub reach: Option<String>,
}

fn is_flow_control(op: u32) -> bool {
    (32..=47).contains(&op)
}

/// Scans the kernel at `addr` in `space` (at most `limit` bytes, and never more than
/// [`MAX_KERNEL_BYTES`]).
pub fn scan_kernel(
    gen: Gen,
    mem: &dyn GpuMemory,
    space: AddressSpace,
    addr: u64,
    limit: Option<u64>,
) -> KernelScan {
    let mut out = KernelScan::default();
    let limit = limit.unwrap_or(MAX_KERNEL_BYTES).min(MAX_KERNEL_BYTES);
    let mut off = 0u64;
    let mut chunk = [0u32; 4];
    let split_sends = gen != Gen::Gen8;
    loop {
        if off + 8 > limit {
            out.reach = Some(format!("no end of thread within {limit} bytes"));
            return out;
        }
        let Some(at) = addr.checked_add(off) else {
            out.reach = Some("kernel address overflows".into());
            return out;
        };
        // Read the first half; a native instruction needs the second.
        if let Err(e) = mem.read_dwords(space, at, &mut chunk[..2]) {
            out.reach = Some(format!("kernel unreadable: {e}"));
            return out;
        }
        let op = chunk[0] & 0x7f;
        let compacted = (chunk[0] >> 29) & 1 == 1;
        let is_send =
            matches!(op, OP_SEND | OP_SENDC) || (split_sends && matches!(op, OP_SENDS | OP_SENDSC));
        if op == 0 {
            out.reach = Some(format!("illegal instruction at +{off:#x}"));
            return out;
        }
        if is_flow_control(op) {
            out.reach = Some(format!("control flow (opcode {op}) at +{off:#x}"));
            return out;
        }
        if compacted {
            if is_send {
                out.reach = Some(format!("compacted SEND at +{off:#x}"));
                return out;
            }
            off += 8;
            continue;
        }
        if off + 16 > limit {
            out.reach = Some(format!("no end of thread within {limit} bytes"));
            return out;
        }
        if !is_send {
            off += 16;
            continue;
        }
        if let Err(e) = mem.read_dwords(space, at + 8, &mut chunk[2..]) {
            out.reach = Some(format!("kernel unreadable: {e}"));
            return out;
        }
        let sfid = (chunk[0] >> 24) & 0xf;
        let eot = chunk[3] >> 31 == 1;
        // Immediate descriptor: SEND's src1 register file (bits 90:89) is IMM (3); SENDS's
        // descriptor-select bit 77 is clear.
        let immediate = if matches!(op, OP_SEND | OP_SENDC) {
            (chunk[2] >> 25) & 3 == 3
        } else {
            (chunk[2] >> 13) & 1 == 0
        };
        let desc_mask = if gen == Gen::Gen8 {
            0x1fff_ffff
        } else {
            0x7fff_ffff
        };
        let desc = immediate.then_some(chunk[3] & desc_mask);
        if let Err(why) = classify(&mut out, sfid, desc) {
            out.reach = Some(format!("{why} at +{off:#x}"));
            return out;
        }
        off += 16;
        if eot {
            return out;
        }
    }
}

/// Adds one message to `out`; `Err` when the message can address beyond the binding table.
fn classify(out: &mut KernelScan, sfid: u32, desc: Option<u32>) -> Result<(), String> {
    use sfid::*;
    let index = |d: u32| (d & 0xff) as u8;
    match sfid {
        NULL | GATEWAY | URB | THREAD_SPAWNER | PIXEL_INTERPOLATOR => Ok(()),
        SAMPLER | SAMPLER_CACHE | CONSTANT_CACHE | VME | CRE => {
            // Reads only: the entry is read when it names one (bindless and stateless reads
            // are not tracked; reads never widen a write set).
            if let Some(b) = desc.map(index).filter(|b| u64::from(*b) < 240) {
                out.reads.insert(b);
            }
            Ok(())
        }
        RENDER_CACHE => {
            let d = desc.ok_or("render-cache message with a register descriptor")?;
            let reads = (d >> 14) & 0xf == RC_RENDER_TARGET_READ;
            surface(out, index(d), !reads, false)
        }
        DATA_CACHE => {
            let d = desc.ok_or("data-cache message with a register descriptor")?;
            if (d >> 18) & 1 == 1 {
                // Scratch block read (bit 17 clear) or write (set): general-state relative.
                if (d >> 17) & 1 == 1 {
                    out.stateless = true;
                }
                return Ok(());
            }
            // DC0 reads: OWORD block (0), unaligned OWORD block (1), OWORD dual block (2),
            // DWORD scattered (3), byte scattered (4), untyped read (5 on GEN7).
            let ty = (d >> 14) & 0x1f;
            surface(out, index(d), ty > 5, false)
        }
        DATA_CACHE_1 => {
            let d = desc.ok_or("data-cache message with a register descriptor")?;
            let ty = (d >> 14) & 0x1f;
            match ty {
                // A64 reads (scattered, untyped, OWORD block).
                0x10 | 0x11 | 0x14 => Ok(()),
                // A64 writes and atomics: absolute addresses.
                0x12 | 0x15 | 0x19 | 0x1a | 0x1d => Err("A64 write message".into()),
                // Untyped and typed surface reads, media block read.
                1 | 4 | 5 => surface(out, index(d), false, true),
                _ => surface(out, index(d), true, true),
            }
        }
        other => Err(format!("unknown shared function {other}")),
    }
}

/// Records an access to binding-table index `b` (`dc1`: the message went to data cache 1).
fn surface(out: &mut KernelScan, b: u8, writes: bool, dc1: bool) -> Result<(), String> {
    match b {
        bti::SLM => Ok(()),
        bti::STATELESS => {
            out.stateless |= writes;
            Ok(())
        }
        bti::STATELESS_NC if !dc1 => {
            out.stateless |= writes;
            Ok(())
        }
        bti::STATELESS_NC if writes => Err("A64 message".into()),
        bti::BINDLESS if writes => Err("bindless surface write".into()),
        b if u64::from(b) >= 240 => {
            if writes {
                Err(format!("write to special binding-table index {b}"))
            } else {
                Ok(())
            }
        }
        b => {
            if writes {
                out.writes.insert(b);
            } else {
                out.reads.insert(b);
            }
            Ok(())
        }
    }
}

/// Encoders for the kernels the reference vGPU's guests use (native, uncompacted).
pub mod encode {
    use super::{OP_MOV, OP_NOP, OP_SEND};

    /// A native NOP.
    pub fn nop() -> [u32; 4] {
        [OP_NOP, 0, 0, 0]
    }

    /// A native `mov` (register to register; touches no memory).
    pub fn mov() -> [u32; 4] {
        [OP_MOV, 0, 0, 0]
    }

    /// A SEND to shared function `sfid` with the immediate descriptor `desc` (bit 31 is
    /// end-of-thread, set by `eot`).
    pub fn send(sfid: u32, desc: u32, eot: bool) -> [u32; 4] {
        [
            OP_SEND | ((sfid & 0xf) << 24),
            0,
            3 << 25,
            (desc & 0x7fff_ffff) | (u32::from(eot) << 31),
        ]
    }

    /// A render-target write to binding-table index `bti` (message type 12 in bits 17:14).
    pub fn render_target_write(bti: u8, eot: bool) -> [u32; 4] {
        send(
            super::sfid::RENDER_CACHE,
            (super::RC_RENDER_TARGET_WRITE << 14) | u32::from(bti),
            eot,
        )
    }

    /// A data-cache-1 untyped surface write (type 9) to binding-table index `bti`.
    pub fn untyped_write(bti: u8, eot: bool) -> [u32; 4] {
        send(super::sfid::DATA_CACHE_1, (9 << 14) | u32::from(bti), eot)
    }

    /// A sampler message reading binding-table index `bti`.
    pub fn sample(bti: u8) -> [u32; 4] {
        send(super::sfid::SAMPLER, u32::from(bti), false)
    }

    /// Flattens instructions into kernel dwords.
    pub fn kernel(insts: &[[u32; 4]]) -> Vec<u32> {
        insts.iter().flatten().copied().collect()
    }
}
