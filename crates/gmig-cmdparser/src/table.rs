//! Command tables as data (Mesa style): one [`CommandDesc`] row per command, walked by one generic
//! decoder. Special cases live in a few named [`Hook`]s.
//!
//! The schema is in `desc` (re-exported here), the rows in the private `rows` module (see
//! [`all_commands`]); this module holds the lookup index.

use std::sync::OnceLock;

pub(crate) use crate::desc::resolve_space;
pub use crate::desc::{
    class_of, Access, AddrField, Class, CommandDesc, Cond, Engine, Engines, Flags, Gen, Gens, Hook,
    LengthRule, SizeRule, SpaceRule, Width,
};

/// Dense per-(gen, engine) index: MI opcodes in slots 0..64, 2D opcodes in 64..192, type-3 keys
/// (DW0 bits 28:16) in 192..192+8192. Each engine's index holds only the classes it decodes.
const MI_SLOTS: usize = 64;
const BLIT_SLOTS: usize = 128;
const T3_SLOTS: usize = 8192;
const SLOTS: usize = MI_SLOTS + BLIT_SLOTS + T3_SLOTS;

#[inline]
fn slot_of(dw0: u32) -> Option<usize> {
    match dw0 >> 29 {
        0 => Some((dw0 >> 23) as usize & 0x3f),
        2 => Some(MI_SLOTS + ((dw0 >> 22) as usize & 0x7f)),
        3 => Some(MI_SLOTS + BLIT_SLOTS + ((dw0 >> 16) as usize & 0x1fff)),
        _ => None,
    }
}

fn class_fits(class: Class, engine: Engine) -> bool {
    match class {
        Class::Mi => true,
        Class::Blit => engine == Engine::Blitter,
        Class::Render3d => engine == Engine::Render,
        Class::Mfx => engine == Engine::Video,
        Class::Vebox => engine == Engine::VideoEnhance,
    }
}

/// One slot of the index: the row (index + 1, 0 for none) in bits 15:0, and the row's length rule
/// (so a command's length needs no second load): the DWord Length field's width in bits 23:16
/// (0 for a fixed length) and the bias (or the fixed length) in bits 31:24.
fn slot_entry(row: usize, d: &CommandDesc) -> u32 {
    let (bits, bias) = match d.length {
        LengthRule::Fixed(n) => (0u8, n),
        LengthRule::Variable { bits, bias } => (bits, bias),
    };
    u32::from(u16::try_from(row + 1).unwrap_or(0)) | u32::from(bits) << 16 | u32::from(bias) << 24
}

fn index() -> &'static [u32] {
    static INDEX: OnceLock<Vec<u32>> = OnceLock::new();
    INDEX.get_or_init(|| {
        let mut map = vec![0u32; 3 * 4 * SLOTS];
        for gen in Gen::ALL {
            for engine in Engine::ALL {
                let base = (gen.index() * 4 + engine.index()) * SLOTS;
                for (i, d) in crate::rows::COMMANDS.iter().enumerate() {
                    // Rows are checked for class/engine consistency and duplicate keys by tests;
                    // the first available row wins.
                    if !d.available(gen, engine) || !class_fits(d.class, engine) {
                        continue;
                    }
                    let shift = match d.class {
                        Class::Mi => 23,
                        Class::Blit => 22,
                        _ => 16,
                    };
                    let Some(s) = slot_of(d.opcode << shift) else {
                        continue;
                    };
                    if let Some(e) = map.get_mut(base + s) {
                        if *e == 0 {
                            *e = slot_entry(i, d);
                        }
                    }
                }
            }
        }
        map
    })
}

/// The command table of one generation and engine: a cheap, copyable handle for repeated
/// lookups (the decoder holds one).
#[derive(Clone, Copy, Debug)]
pub struct Table {
    slots: &'static [u32],
}

impl Table {
    /// The table of `gen`/`engine`.
    pub fn new(gen: Gen, engine: Engine) -> Table {
        let base = (gen.index() * 4 + engine.index()) * SLOTS;
        Table {
            slots: index().get(base..base + SLOTS).unwrap_or(&[]),
        }
    }

    /// The row for `dw0`, or `None` when the opcode is unknown here.
    #[inline]
    pub fn lookup(&self, dw0: u32) -> Option<&'static CommandDesc> {
        self.lookup_len(dw0).map(|(d, _)| d)
    }

    /// The row for `dw0` and the command's length in dwords (`CommandDesc::len_of`), or `None`
    /// when the opcode is unknown here.
    #[inline]
    pub fn lookup_len(&self, dw0: u32) -> Option<(&'static CommandDesc, usize)> {
        let e = *self.slots.get(slot_of(dw0)?)?;
        let row = crate::rows::COMMANDS.get(((e & 0xffff) as usize).wrapping_sub(1))?;
        let bits = (e >> 16) & 0x1f;
        let mask = (1u32 << bits) - 1;
        Some((row, (dw0 & mask) as usize + (e >> 24) as usize))
    }
}

/// The table row for `dw0` on `gen`/`engine`, or `None` when the opcode is unknown there.
pub fn lookup(gen: Gen, engine: Engine, dw0: u32) -> Option<&'static CommandDesc> {
    Table::new(gen, engine).lookup(dw0)
}

/// Looks a command up by name (first row of that name available on `gen`/`engine`).
pub fn by_name(gen: Gen, engine: Engine, name: &str) -> Option<&'static CommandDesc> {
    crate::rows::COMMANDS
        .iter()
        .find(|d| d.name == name && d.available(gen, engine))
}

/// Every row of the tables (all generations and engines).
pub fn all_commands() -> &'static [CommandDesc] {
    crate::rows::COMMANDS
}
