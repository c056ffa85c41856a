//! Command tables as data (Mesa style): one [`CommandDesc`] row per command, walked by one generic
//! decoder. Special cases live in a few named [`Hook`]s.
//!
//! The schema is in `desc` (re-exported here), the rows in the private `rows` module (see
//! [`all_commands`]); this module holds the lookup index.

use std::sync::OnceLock;

pub(crate) use crate::desc::resolve_space;
pub use crate::desc::{
    class_of, Access, AddrField, Class, CommandDesc, Cond, Engine, Engines, Flags, Gen, Gens, Hook,
    IndexRule, LengthRule, SizeRule, SpaceRule, StatusPage, Width,
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

/// One slot of the index: the row (index + 1, 0 for none) in bits 10:0, the row's
/// [surface code](crate::indirect::surface_code) in bits 15:11, and the row's length rule (so a
/// command's length needs no second load): the DWord Length field's width in bits 20:16 (0 for a
/// fixed length) and the bias (or the fixed length) in bits 31:24. Bit 23 is set when the row is
/// [`quiet`].
fn slot_entry(row: usize, d: &CommandDesc) -> u32 {
    let (bits, bias) = match d.length {
        LengthRule::Fixed(n) => (0u8, n),
        LengthRule::Variable { bits, bias } => (bits, bias),
    };
    // A row past the index's reach is left out (a test checks that none is).
    let Some(row) = u32::try_from(row + 1).ok().filter(|r| *r <= ROW_MASK) else {
        return 0;
    };
    row | (u32::from(crate::indirect::surface_code(d)) & 0x1f) << SURFACE_SHIFT
        | u32::from(bits & 0x1f) << 16
        | u32::from(quiet(d)) << QUIET_BIT
        | u32::from(bias) << 24
}

/// The bits of a slot entry that hold the row (index + 1).
const ROW_MASK: u32 = 0x7ff;
/// Where a slot entry's surface code starts.
const SURFACE_SHIFT: u32 = 11;
/// Bit of a slot entry set for a [`quiet`] row.
const QUIET_BIT: u32 = 23;

/// What [`Table::lookup_entry`] finds for a DW0.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    /// The row.
    pub(crate) desc: &'static CommandDesc,
    /// The command's length in dwords (`CommandDesc::len_of`).
    pub(crate) len: usize,
    /// Whether the row is [`quiet`].
    pub(crate) quiet: bool,
    /// The row's [surface code](crate::indirect::surface_code).
    pub(crate) surface: u8,
}

/// Whether a row is *quiet*: a command of it, once decoded, passes the audit whatever its dwords
/// and buffer, has no address to audit or rebase, and changes nothing in the indirect state the
/// walks follow (no flags, no hook, no address fields, no exact length, and a role that records
/// nothing). The remap walk counts such commands without visiting them.
pub(crate) fn quiet(d: &CommandDesc) -> bool {
    d.flags == Flags::NONE
        && d.hook == Hook::None
        && d.addrs.is_empty()
        && d.exact_len.is_none()
        && crate::indirect::records_nothing(d)
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
        self.lookup_entry(dw0).map(|e| (e.desc, e.len))
    }

    /// [`Table::lookup_len`], and what the slot says of the row besides.
    #[inline]
    pub(crate) fn lookup_entry(&self, dw0: u32) -> Option<Entry> {
        let e = *self.slots.get(slot_of(dw0)?)?;
        let desc = crate::rows::COMMANDS.get(((e & ROW_MASK) as usize).wrapping_sub(1))?;
        let bits = (e >> 16) & 0x1f;
        let mask = (1u32 << bits) - 1;
        Some(Entry {
            desc,
            len: (dw0 & mask) as usize + (e >> 24) as usize,
            quiet: (e >> QUIET_BIT) & 1 == 1,
            surface: ((e >> SURFACE_SHIFT) & 0x1f) as u8,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slot's quiet bit and surface code say what the row's own rules say, and a quiet row
    /// is one whose commands the walks may count without visiting.
    #[test]
    fn slot_bits_match_their_rows() {
        assert!(crate::rows::COMMANDS.len() < ROW_MASK as usize);
        let mut quiet_rows = 0;
        for gen in Gen::ALL {
            for engine in Engine::ALL {
                let t = Table::new(gen, engine);
                for (slot, e) in t.slots.iter().enumerate() {
                    if *e == 0 {
                        continue;
                    }
                    let d = &crate::rows::COMMANDS[(*e & ROW_MASK) as usize - 1];
                    let dw0 = d.header(d.len_of(0).max(1) as u32);
                    assert_eq!(slot_of(dw0), Some(slot), "{}", d.name);
                    let got = t.lookup_entry(dw0).unwrap();
                    assert!(core::ptr::eq(got.desc, d));
                    assert_eq!(got.quiet, quiet(d), "{}", d.name);
                    assert_eq!(got.surface, crate::indirect::surface_code(d), "{}", d.name);
                    assert_ne!(got.surface, crate::indirect::SURFACE_UNKNOWN, "{}", d.name);
                    if crate::indirect::records_nothing(d) {
                        assert_eq!(got.surface, crate::indirect::SURFACE_SKIP, "{}", d.name);
                    }
                    if got.quiet {
                        quiet_rows += 1;
                        assert!(
                            got.surface == crate::indirect::SURFACE_SKIP
                                && d.addrs.is_empty()
                                && d.flags == Flags::NONE
                        );
                    }
                }
            }
        }
        assert!(quiet_rows > 0);
        let quiet_of = |name| quiet(by_name(Gen::Gen9, Engine::Render, name).unwrap());
        assert!(quiet_of("3DSTATE_SBE") && quiet_of("MI_NOOP"));
        for busy in [
            "3DSTATE_VS",
            "3DPRIMITIVE",
            "PIPE_CONTROL",
            "MI_LOAD_REGISTER_IMM",
            "MI_BATCH_BUFFER_END",
        ] {
            assert!(!quiet_of(busy), "{busy}");
        }
    }
}
