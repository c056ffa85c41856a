//! Aubinator-like listings: for each submission of a capture (or for a raw buffer of dwords), every
//! command in execution order with where it lives, its name and length, each address it uses
//! with its space and, for a draw, a dispatch or a video decode, the surfaces it reads and writes
//! through indirect state ([`Footprint`]). `gmig decode` prints these, and the fixtures' expected
//! decodes are these. [`write_sets`] gives what each submission may write, as the migration engine
//! counts it (the fixtures' expected write sets).

use std::fmt::Write as _;

use super::{AubEvent, AubReader, MemoryImage, RingState, Submission};
use crate::indirect::SurfaceRole;
use crate::{
    walk, Access, AddressRange, AddressSpace, AddressUse, BatchContext, BatchLevel, Budget,
    Decoder, Engine, Footprint, Gen, IndirectState, Reach, WalkError, WalkSummary, WalkedCommand,
    WriteSet,
};

/// One command of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandLine {
    /// Index of the submission it ran in (`None` for a raw buffer).
    pub submission: Option<usize>,
    /// Ring, first- or second-level batch.
    pub level: BatchLevel,
    /// Space the command was fetched through.
    pub space: AddressSpace,
    /// Address of DW0 (for a raw buffer: its byte offset).
    pub addr: u64,
    /// Dword offset of DW0 from the start of its buffer (ring head or batch start).
    pub offset: usize,
    /// Command name.
    pub name: &'static str,
    /// Length in dwords.
    pub dwords: usize,
    /// Addresses it uses.
    pub addresses: Vec<AddressUse>,
    /// For a work command: what it reads and writes through indirect state.
    pub footprint: Option<Footprint>,
}

/// An item of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListingItem {
    /// The capture's header.
    Header {
        /// Generation, if the capture names a known device.
        gen: Option<Gen>,
        /// Application name.
        app_name: String,
    },
    /// A submission starts.
    Submission {
        /// Its index.
        index: usize,
        /// The submission.
        submission: Submission,
    },
    /// A command.
    Command(CommandLine),
    /// Decoding stopped (the capture, or the walk of one submission).
    Error {
        /// Submission whose walk failed, or `None` for the capture or a raw buffer.
        submission: Option<usize>,
        /// Why.
        message: String,
    },
}

/// The budget listings walk with: enough for any real submission, small enough that a self-looping
/// batch ends quickly.
pub const LISTING_BUDGET: Budget = Budget {
    max_commands: 1 << 16,
    max_batch_bytes: 16 << 20,
    max_batches: 256,
};

/// Most commands [`list_capture`] lists over all submissions together, so that a small hostile
/// capture (many submissions of a self-looping batch) cannot make a listing endless.
pub const MAX_LISTED_COMMANDS: u64 = 1 << 22;

/// List a capture: every submission, walked through the memory as it stood when it was submitted.
/// `gen` overrides the capture's generation (and stands in when the capture names none). Errors
/// end the listing (capture errors) or the submission (walk errors) with an [`ListingItem::Error`].
#[must_use]
pub fn list_capture(bytes: &[u8], gen: Option<Gen>, budget: Budget) -> Vec<ListingItem> {
    let mut items = Vec::new();
    let mut reader = AubReader::new(bytes);
    let mut index = 0usize;
    let mut left = MAX_LISTED_COMMANDS;
    loop {
        match reader.next_event() {
            Ok(None) => break,
            Err(e) => {
                items.push(ListingItem::Error {
                    submission: None,
                    message: e.to_string(),
                });
                break;
            }
            Ok(Some(AubEvent::Version {
                gen: g, app_name, ..
            })) => {
                items.push(ListingItem::Header { gen: g, app_name });
            }
            Ok(Some(AubEvent::Submit { submission, .. })) => {
                items.push(ListingItem::Submission { index, submission });
                let Some(gen) = gen.or(reader.capture().gen) else {
                    items.push(ListingItem::Error {
                        submission: Some(index),
                        message: "the capture names no known generation; give one".to_owned(),
                    });
                    index += 1;
                    continue;
                };
                if left == 0 {
                    items.push(ListingItem::Error {
                        submission: Some(index),
                        message: format!(
                            "listing stopped: {MAX_LISTED_COMMANDS} commands listed in all"
                        ),
                    });
                    break;
                }
                let mut lines = Vec::new();
                let walk_budget = Budget {
                    max_commands: budget.max_commands.min(left),
                    ..budget
                };
                let r = walk_submission(
                    gen,
                    &submission,
                    reader.image(),
                    walk_budget,
                    &mut |w, _, footprint| {
                        lines.push(CommandLine {
                            submission: Some(index),
                            level: w.ctx.level,
                            space: w.space,
                            addr: w.addr,
                            offset: w.cmd.offset,
                            name: w.cmd.desc.name,
                            dwords: w.cmd.len(),
                            addresses: w.cmd.addresses(&w.ctx).collect(),
                            footprint,
                        });
                    },
                );
                left = left.saturating_sub(lines.len() as u64);
                items.extend(lines.into_iter().map(ListingItem::Command));
                if let Err(e) = r {
                    items.push(ListingItem::Error {
                        submission: Some(index),
                        message: e.to_string(),
                    });
                }
                index += 1;
            }
            Ok(Some(_)) => {}
        }
    }
    items
}

/// List a raw buffer of dwords as a privileged ring-level buffer would run (no batches followed).
#[must_use]
pub fn list_raw(gen: Gen, engine: Engine, dwords: &[u32]) -> Vec<ListingItem> {
    let ctx = BatchContext::RING;
    let mut items = Vec::new();
    let mut d = Decoder::new(gen, engine, dwords);
    loop {
        match d.next() {
            Ok(Some(cmd)) => items.push(ListingItem::Command(CommandLine {
                submission: None,
                level: BatchLevel::Ring,
                space: AddressSpace::Ggtt,
                addr: (cmd.offset as u64) * 4,
                offset: cmd.offset,
                name: cmd.desc.name,
                dwords: cmd.len(),
                addresses: cmd.addresses(&ctx).collect(),
                // A raw buffer has no memory behind it to follow state into.
                footprint: None,
            })),
            Ok(None) => break,
            Err(e) => {
                items.push(ListingItem::Error {
                    submission: None,
                    message: e.to_string(),
                });
                break;
            }
        }
    }
    items
}

/// Walks a submission through the memory `image` holds, following its indirect state; `f` gets
/// each command with its write set and, for work commands, its footprint.
fn walk_submission(
    gen: Gen,
    s: &Submission,
    image: &MemoryImage,
    budget: Budget,
    f: &mut dyn FnMut(&WalkedCommand<'_>, WriteSet, Option<Footprint>),
) -> Result<WalkSummary, WalkError> {
    let mem = s.memory(image);
    // The context addresses memory through its PPGTT when it has one.
    let space = if s.pml4 != 0 {
        AddressSpace::Ppgtt
    } else {
        AddressSpace::Ggtt
    };
    let mut state = IndirectState::new(gen, space);
    walk(gen, s.engine, &mem, s.ring_span(), budget, &mut |w| {
        let (set, footprint) = state.step(&w.cmd, &w.ctx, &mem);
        f(w, set, footprint);
        Ok(())
    })
}

/// What one submission may write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubmissionWrites {
    /// Index of the submission.
    pub submission: usize,
    /// Its write set: the commands' own and their indirect state's ranges (merged per space), and
    /// the reach that bounds what they do not name.
    pub writes: WriteSet,
    /// Why the walk stopped early, if it did (the write set is then the commands walked so far).
    pub stopped: Option<String>,
}

/// The write set of every submission of a capture, as the migration engine collects it: command
/// by command, with indirect state followed ([`IndirectState::step`]).
#[must_use]
pub fn write_sets(bytes: &[u8], gen: Option<Gen>, budget: Budget) -> Vec<SubmissionWrites> {
    let mut out = Vec::new();
    let mut reader = AubReader::new(bytes);
    while let Ok(Some(ev)) = reader.next_event() {
        let AubEvent::Submit { submission, .. } = ev else {
            continue;
        };
        let index = out.len();
        let Some(gen) = gen.or(reader.capture().gen) else {
            out.push(SubmissionWrites {
                submission: index,
                writes: WriteSet::Unknown,
                stopped: Some("the capture names no known generation".to_owned()),
            });
            continue;
        };
        let mut writes = WriteSet::Nothing;
        let r = walk_submission(
            gen,
            &submission,
            reader.image(),
            budget,
            &mut |_, set, _| {
                writes = std::mem::replace(&mut writes, WriteSet::Nothing).union(set);
            },
        );
        out.push(SubmissionWrites {
            submission: index,
            writes: merged(writes),
            stopped: r.err().map(|e| e.to_string()),
        });
    }
    out
}

/// `w` with its ranges sorted and overlapping or touching ones merged (per space).
fn merged(w: WriteSet) -> WriteSet {
    fn merge(mut v: Vec<AddressRange>) -> Vec<AddressRange> {
        v.sort_by_key(|r| (r.space.to_string(), r.start));
        let mut out: Vec<AddressRange> = Vec::with_capacity(v.len());
        for r in v {
            match out.last_mut() {
                Some(l) if l.space == r.space && r.start <= l.start.saturating_add(l.len) => {
                    let end = l
                        .start
                        .saturating_add(l.len)
                        .max(r.start.saturating_add(r.len));
                    l.len = end - l.start;
                }
                _ => out.push(r),
            }
        }
        out
    }
    match w {
        WriteSet::Ranges(r) => WriteSet::Ranges(merge(r)),
        WriteSet::WithinReach { ranges, reach } => WriteSet::WithinReach {
            ranges: merge(ranges),
            reach,
        },
        o => o,
    }
}

fn reach_text(r: Reach) -> &'static str {
    match (r.ggtt, r.ppgtt) {
        (true, true) => "the GGTT and the PPGTT",
        (true, false) => "the GGTT",
        (false, true) => "the PPGTT",
        (false, false) => "nothing",
    }
}

/// The write sets as text: per submission, its ranges and what bounds the rest.
#[must_use]
pub fn write_sets_text(sets: &[SubmissionWrites]) -> String {
    let mut s = String::new();
    for w in sets {
        let (ranges, rest) = match &w.writes {
            WriteSet::Nothing => (&[][..], "nothing else".to_owned()),
            WriteSet::Ranges(r) => (&r[..], "nothing else".to_owned()),
            WriteSet::WithinReach { ranges, reach } => (
                &ranges[..],
                format!("the rest within what {} maps", reach_text(*reach)),
            ),
            WriteSet::Unknown => (&[][..], "anything (unknown)".to_owned()),
        };
        let _ = writeln!(
            s,
            "submission {}: {} range(s), {rest}",
            w.submission,
            ranges.len()
        );
        for r in ranges {
            let _ = writeln!(
                s,
                "  {:<5} 0x{:012x}+0x{:x}",
                r.space.to_string(),
                r.start,
                r.len
            );
        }
        if let Some(why) = &w.stopped {
            let _ = writeln!(s, "  walk stopped: {why}");
        }
    }
    s
}

/// A surface role as listings name it (`ps bt[3]`, `depth`, `so[1]`, ...).
#[must_use]
pub fn role_name(role: SurfaceRole) -> String {
    let stage = |s: crate::Stage| format!("{s:?}").to_lowercase();
    match role {
        SurfaceRole::Bound { stage: s, index } => format!("{} bt[{index}]", stage(s)),
        SurfaceRole::Aux { stage: s, index } => format!("{} bt[{index}] aux", stage(s)),
        SurfaceRole::Depth => "depth".to_owned(),
        SurfaceRole::Stencil => "stencil".to_owned(),
        SurfaceRole::HierDepth => "hiz".to_owned(),
        SurfaceRole::StreamOut { index } => format!("so[{index}]"),
        SurfaceRole::StreamOutOffset { index } => format!("so[{index}] offset"),
        SurfaceRole::Stateless => "stateless".to_owned(),
        SurfaceRole::VideoDestination => "video destination".to_owned(),
        SurfaceRole::VideoRowStore => "video row store".to_owned(),
        SurfaceRole::Bitstream => "bitstream".to_owned(),
    }
}

fn footprint_text(s: &mut String, fp: &Footprint) {
    for u in &fp.surfaces {
        let _ = writeln!(
            s,
            "      {:<5} {:<5} 0x{:012x}+0x{:<8x} {}",
            if u.writes { "write" } else { "read" },
            u.space.to_string(),
            u.start,
            u.len,
            role_name(u.role)
        );
    }
    for st in &fp.surface_states {
        let _ = writeln!(
            s,
            "      state {:<5} 0x{:012x}            {} bt[{}]",
            st.space.to_string(),
            st.addr,
            format!("{:?}", st.stage).to_lowercase(),
            st.index
        );
    }
    for why in &fp.reach {
        let _ = writeln!(s, "      reach {why}");
    }
}

/// Lower-case name of a batch level.
#[must_use]
pub fn level_name(level: BatchLevel) -> &'static str {
    match level {
        BatchLevel::Ring => "ring",
        BatchLevel::First => "batch1",
        BatchLevel::Second => "batch2",
    }
}

/// Lower-case name of an access.
#[must_use]
pub fn access_name(access: Access) -> &'static str {
    match access {
        Access::Read => "read",
        Access::Write => "write",
        Access::ReadWrite => "read-write",
    }
}

fn engine_name(engine: Engine) -> &'static str {
    super::fixture::manifest::engine_name(engine)
}

fn ring_text(r: &RingState) -> String {
    format!(
        "ring ggtt 0x{:08x} size 0x{:x} head 0x{:x} tail 0x{:x}",
        r.start.0, r.size, r.head, r.tail
    )
}

/// The listing as text, one line per header, submission, command, address and error.
#[must_use]
pub fn to_text(items: &[ListingItem]) -> String {
    let mut s = String::new();
    for item in items {
        match item {
            ListingItem::Header { gen, app_name } => {
                let g = gen.map_or("unknown", super::fixture::manifest::gen_name);
                let _ = writeln!(s, "capture: gen {g}, application {app_name:?}");
            }
            ListingItem::Submission {
                index,
                submission: sub,
            } => {
                let _ = writeln!(
                    s,
                    "submission {index}: engine {}, descriptor 0x{:016x}, context ggtt 0x{:08x}, {}, pml4 phys 0x{:x}",
                    engine_name(sub.engine),
                    sub.descriptor,
                    sub.lrca.0,
                    ring_text(&sub.ring),
                    sub.pml4
                );
            }
            ListingItem::Command(c) => {
                let _ = writeln!(
                    s,
                    "  {:<5} 0x{:012x}  {:<6} +0x{:04x}  {} ({} dwords)",
                    c.space.to_string(),
                    c.addr,
                    level_name(c.level),
                    c.offset * 4,
                    c.name,
                    c.dwords
                );
                for u in &c.addresses {
                    let range = if u.bounded {
                        format!("0x{:x}+0x{:x}", u.start, u.len)
                    } else {
                        format!("0x{:x}+?", u.start)
                    };
                    let _ = writeln!(
                        s,
                        "      dw{:<2} {:<12} {:<5} 0x{:012x}  {:<10} {range}",
                        u.dword,
                        u.name,
                        u.space.to_string(),
                        u.addr,
                        access_name(u.access)
                    );
                }
                if let Some(fp) = &c.footprint {
                    footprint_text(&mut s, fp);
                }
            }
            ListingItem::Error {
                submission,
                message,
            } => match submission {
                Some(i) => {
                    let _ = writeln!(s, "error: submission {i}: {message}");
                }
                None => {
                    let _ = writeln!(s, "error: {message}");
                }
            },
        }
    }
    s
}
