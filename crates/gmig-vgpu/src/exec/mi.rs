//! The MI commands the engine runs: stores, flushes' post-sync writes, register loads and stores
//! (immediate, register to register, from and to memory), `MI_MATH` on the engine's general
//! purpose registers, `MI_CONDITIONAL_BATCH_BUFFER_END` and `MI_SEMAPHORE_WAIT` against guest
//! memory.
//!
//! Registers are read through the device ([`RegFile`]): the vGPU's registers as the guest would
//! read them, overlaid with what the workload's own commands wrote so far (those writes reach
//! the device when the span ends, as [`SideEffect::Reg`]).

use std::collections::BTreeMap;

use super::{addr48, dw, holds, Ctx, Outcome, SideEffect};
use crate::gtt::{GttError, Space};
use crate::work::ShadowCommand;

/// The engine's view of registers during a workload.
pub(super) struct RegFile<'a> {
    read: &'a dyn Fn(u32) -> u32,
    written: BTreeMap<u32, u32>,
}

impl<'a> RegFile<'a> {
    pub(super) fn new(read: &'a dyn Fn(u32) -> u32) -> Self {
        RegFile {
            read,
            written: BTreeMap::new(),
        }
    }

    fn get(&self, reg: u32) -> u32 {
        self.written
            .get(&reg)
            .copied()
            .unwrap_or_else(|| (self.read)(reg))
    }

    fn set(&mut self, reg: u32, value: u32, effects: &mut Vec<SideEffect>) {
        self.written.insert(reg, value);
        effects.push(SideEffect::Reg(reg, value));
    }

    fn get64(&self, reg: u32) -> u64 {
        u64::from(self.get(reg)) | (u64::from(self.get(reg + 4)) << 32)
    }

    fn set64(&mut self, reg: u32, value: u64, effects: &mut Vec<SideEffect>) {
        self.set(reg, value as u32, effects);
        self.set(reg + 4, (value >> 32) as u32, effects);
    }
}

/// The register a register command names (bits 22:2).
fn reg_of(d: u32) -> u32 {
    d & 0x007f_fffc
}

/// The space DW0 bit 22 ("use global GTT") selects.
fn space_of(d0: u32) -> Space {
    if d0 & (1 << 22) != 0 {
        Space::Ggtt
    } else {
        Space::Ppgtt
    }
}

/// `CS_GPR(n)`: the engine's sixteen 64-bit general purpose registers at base + 0x600.
const GPR: u32 = 0x600;

pub(super) fn run_mi(
    ctx: &mut Ctx<'_>,
    cmd: &ShadowCommand,
    name: &'static str,
    clock: u64,
    effects: &mut Vec<SideEffect>,
) -> Result<Outcome, GttError> {
    let d0 = dw(cmd, 0);
    match name {
        "MI_USER_INTERRUPT" => {
            effects.push(SideEffect::Interrupt);
            Ok(Outcome::Executed)
        }
        // Flow was already followed by the walk.
        "MI_NOOP" | "MI_BATCH_BUFFER_END" | "MI_BATCH_BUFFER_START" => Ok(Outcome::Executed),
        "MI_STORE_DATA_IMM" => {
            // MI_STORE_DATA_IMM: DW1-2 address, DW3.. data.
            if !holds(cmd, 1, 2) {
                return Ok(Outcome::Executed);
            }
            let addr = addr48(dw(cmd, 1), dw(cmd, 2), 3);
            let data: Vec<u8> = cmd
                .dwords
                .iter()
                .skip(3)
                .flat_map(|d| d.to_le_bytes())
                .collect();
            ctx.write(space_of(d0), addr, &data)?;
            Ok(Outcome::Executed)
        }
        "MI_STORE_DATA_INDEX" => {
            // DW1 the offset into the status page, DW2.. the data.
            if let Some(u) = ctx.index_use(cmd) {
                let data: Vec<u8> = cmd
                    .dwords
                    .iter()
                    .skip(2)
                    .flat_map(|d| d.to_le_bytes())
                    .collect();
                ctx.write_index(u.per_process, u.offset, &data)?;
            }
            Ok(Outcome::Executed)
        }
        "MI_LOAD_REGISTER_IMM" => {
            // MI_LOAD_REGISTER_IMM: (register, value) pairs.
            for pair in cmd.dwords.get(1..).unwrap_or(&[]).chunks_exact(2) {
                ctx.regs.set(reg_of(pair[0]), pair[1], effects);
            }
            Ok(Outcome::Executed)
        }
        "MI_LOAD_REGISTER_REG" => {
            // DW1 source, DW2 destination.
            let v = ctx.regs.get(reg_of(dw(cmd, 1)));
            ctx.regs.set(reg_of(dw(cmd, 2)), v, effects);
            Ok(Outcome::Executed)
        }
        "MI_LOAD_REGISTER_MEM" => {
            // DW1 register, DW2-3 address.
            let addr = addr48(dw(cmd, 2), dw(cmd, 3), 3);
            let v = ctx.view.read_u32(space_of(d0), addr)?;
            ctx.regs.set(reg_of(dw(cmd, 1)), v, effects);
            Ok(Outcome::Executed)
        }
        "MI_STORE_REGISTER_MEM" => {
            // DW1 register, DW2-3 address.
            let addr = addr48(dw(cmd, 2), dw(cmd, 3), 3);
            let v = ctx.regs.get(reg_of(dw(cmd, 1)));
            ctx.write(space_of(d0), addr, &v.to_le_bytes())?;
            Ok(Outcome::Executed)
        }
        "MI_MATH" => {
            let mut alu = Alu::default();
            for &insn in cmd.dwords.get(1..).unwrap_or(&[]) {
                alu.step(insn, ctx.mmio_base + GPR, &mut ctx.regs, effects);
            }
            Ok(Outcome::Executed)
        }
        "MI_CONDITIONAL_BATCH_BUFFER_END" => {
            // DW0 bit 21 "compare semaphore": the batch ends when the dword at DW2-3 is at most
            // DW1 (IGT's spinners end when their condition dword becomes MI_BATCH_BUFFER_END).
            // Without the compare the command does nothing here.
            if d0 & (1 << 21) == 0 {
                return Ok(Outcome::Executed);
            }
            let addr = addr48(dw(cmd, 2), dw(cmd, 3), 3);
            let mem = ctx.view.read_u32(space_of(d0), addr)?;
            Ok(if mem <= dw(cmd, 1) {
                Outcome::EndBatch
            } else {
                Outcome::Executed
            })
        }
        "MI_SEMAPHORE_WAIT" => {
            // DW0 bit 15 polling mode, bits 14:12 the compare, DW1 the data, DW2-3 the address.
            // The engine cannot wait inside a workload: an unmet condition stops the workload
            // at this command, to be tried again when the engines next run.
            let addr = addr48(dw(cmd, 2), dw(cmd, 3), 3);
            let mem = ctx.view.read_u32(space_of(d0), addr)?;
            let data = dw(cmd, 1);
            let met = match (d0 >> 12) & 7 {
                0 => mem > data,
                1 => mem >= data,
                2 => mem < data,
                3 => mem <= data,
                4 => mem == data,
                5 => mem != data,
                _ => true,
            };
            Ok(if met {
                Outcome::Executed
            } else {
                Outcome::Wait
            })
        }
        "MI_FLUSH_DW" => {
            // MI_FLUSH_DW: post-sync op in DW0 15:14, DW1 bit 2 = GGTT.
            let op = (d0 >> 14) & 3;
            if op == 0 {
                return Ok(Outcome::Executed);
            }
            let value = if op == 1 {
                u64::from(dw(cmd, 3)) | (u64::from(dw(cmd, 4)) << 32)
            } else {
                clock
            };
            let len = if op == 1 && cmd.dwords.len() < 5 {
                4
            } else {
                8
            };
            let bytes = &value.to_le_bytes()[..len];
            // "Store data index" (DW0 bit 21): DW1 is an offset into the context's status page.
            if let Some(u) = ctx.index_use(cmd) {
                ctx.write_index(u.per_process, u.offset, bytes)?;
                return Ok(Outcome::Executed);
            }
            if !holds(cmd, 1, 2) {
                return Ok(Outcome::Executed);
            }
            let space = if dw(cmd, 1) & (1 << 2) != 0 {
                Space::Ggtt
            } else {
                Space::Ppgtt
            };
            let addr = addr48(dw(cmd, 1), dw(cmd, 2), 7);
            ctx.write(space, addr, bytes)?;
            Ok(Outcome::Executed)
        }
        _ => Ok(Outcome::Skipped(name)),
    }
}

/// `MI_MATH`'s ALU (GEN8+ encoding: opcode bits 31:20, operand 1 bits 19:10, operand 2 bits
/// 9:0): two source registers, the accumulator and the zero and carry flags, which a `STORE`
/// writes as all ones when set.
#[derive(Default)]
struct Alu {
    src_a: u64,
    src_b: u64,
    accu: u64,
    zf: bool,
    cf: bool,
}

const OP_LOAD: u32 = 0x080;
const OP_LOADINV: u32 = 0x480;
const OP_LOAD0: u32 = 0x081;
const OP_LOAD1: u32 = 0x481;
const OP_ADD: u32 = 0x100;
const OP_SUB: u32 = 0x101;
const OP_AND: u32 = 0x102;
const OP_OR: u32 = 0x103;
const OP_XOR: u32 = 0x104;
const OP_STORE: u32 = 0x180;
const OP_STOREINV: u32 = 0x580;
const SRCA: u32 = 0x20;
const SRCB: u32 = 0x21;
const ACCU: u32 = 0x31;
const ZF: u32 = 0x32;
const CF: u32 = 0x33;

impl Alu {
    fn step(&mut self, insn: u32, gpr: u32, regs: &mut RegFile<'_>, effects: &mut Vec<SideEffect>) {
        let (op, o1, o2) = (insn >> 20, (insn >> 10) & 0x3ff, insn & 0x3ff);
        let flag = |b: bool| if b { u64::MAX } else { 0 };
        let operand = |alu: &Alu, o: u32| match o {
            0..=15 => regs.get64(gpr + 8 * o),
            SRCA => alu.src_a,
            SRCB => alu.src_b,
            ACCU => alu.accu,
            ZF => flag(alu.zf),
            CF => flag(alu.cf),
            _ => 0,
        };
        let load = |alu: &mut Alu, v: u64| match o1 {
            SRCA => alu.src_a = v,
            SRCB => alu.src_b = v,
            _ => {}
        };
        match op {
            OP_LOAD => load(self, operand(self, o2)),
            OP_LOADINV => load(self, !operand(self, o2)),
            OP_LOAD0 => load(self, 0),
            OP_LOAD1 => load(self, 1),
            OP_ADD => {
                let (v, c) = self.src_a.overflowing_add(self.src_b);
                self.result(v, c);
            }
            OP_SUB => {
                let (v, c) = self.src_a.overflowing_sub(self.src_b);
                self.result(v, c);
            }
            OP_AND => self.result(self.src_a & self.src_b, false),
            OP_OR => self.result(self.src_a | self.src_b, false),
            OP_XOR => self.result(self.src_a ^ self.src_b, false),
            OP_STORE | OP_STOREINV if o1 < 16 => {
                let v = operand(self, o2);
                let v = if op == OP_STOREINV { !v } else { v };
                regs.set64(gpr + 8 * o1, v, effects);
            }
            _ => {}
        }
    }

    fn result(&mut self, v: u64, carry: bool) {
        self.accu = v;
        self.zf = v == 0;
        self.cf = carry;
    }
}
