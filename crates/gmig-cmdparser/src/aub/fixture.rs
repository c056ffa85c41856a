//! Fixtures: AUB captures of our own command sequences with a manifest (generation, engine, source
//! and destination slices, expected outcome) and their expected decode and remap, as `fixtures/`
//! holds them. [`generate`] makes every fixture's files deterministically; [`replay`] decodes, audits
//! and remaps one; [`check_dir`] compares a replay with the files checked in.
//!
//! A fixture directory holds:
//!
//! | file | what |
//! |---|---|
//! | `manifest.toml` | `key = value` lines: name, gen, engine, description, four slices, expect, refusal |
//! | `capture.aub` | the capture |
//! | `expected-decode.txt` | the listing of the capture (`gmig decode capture.aub`) |
//! | `expected-remap.aub` | remapped capture (only when `expect = "remap"`) |
//! | `expected-remap.txt` | listing of the remapped capture (only when `expect = "remap"`) |
//! | `expected-refusal.txt` | the refusal message (only when `expect = "refuse"`) |

use std::fmt::Write as _;

use super::{cmd, listing};
use super::{AubCapture, AubError, CaptureBuilder, RingSpec, PAGE_SIZE};
use crate::{
    audit_walk, AuditError, Budget, DecodeError, Engine, Gen, GgttOffset, RemapError, Slice,
    SliceMove, VgpuSlices, WalkError,
};

/// Why a fixture or manifest is unusable.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FixtureError {
    /// A manifest line is not `key = value`.
    #[error("manifest line {line}: {reason}")]
    Manifest {
        /// 1-based line number (0 for a missing key).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// Building a fixture's capture failed.
    #[error("building fixture {name}: {source}")]
    Build {
        /// Fixture name.
        name: String,
        /// The failure.
        source: AubError,
    },
    /// A fixture's replay does not have the outcome its manifest names.
    #[error("fixture {name}: {reason}")]
    Outcome {
        /// Fixture name.
        name: String,
        /// What differs.
        reason: String,
    },
}

/// A slice of the GGTT: `base` and `size` in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceSpec {
    /// First byte.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
}

impl SliceSpec {
    fn parse(s: &str) -> Option<Self> {
        let (b, z) = s.split_once('+')?;
        Some(Self {
            base: parse_u64(b)?,
            size: parse_u64(z)?,
        })
    }

    fn text(self) -> String {
        format!("0x{:08x}+0x{:08x}", self.base, self.size)
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16).ok(),
        None => s.replace('_', "").parse().ok(),
    }
}

/// Why a fixture is expected to be refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The AUB capture itself is unreadable (truncated, malformed).
    Aub,
    /// A command buffer ends in the middle of a command.
    Truncated,
    /// A batch loops (or nests) past the walk budget.
    Budget,
    /// A command a mediated parser must refuse.
    Forbidden,
    /// A GGTT address outside the vGPU's slices.
    OutOfSlice,
    /// Anything else the parser cannot make sense of (unknown opcode, bad length, bad ring,
    /// unmapped memory).
    Malformed,
}

impl Refusal {
    /// Manifest spelling.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Aub => "aub",
            Refusal::Truncated => "truncated",
            Refusal::Budget => "budget",
            Refusal::Forbidden => "forbidden",
            Refusal::OutOfSlice => "out-of-slice",
            Refusal::Malformed => "malformed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Refusal::Aub,
            Refusal::Truncated,
            Refusal::Budget,
            Refusal::Forbidden,
            Refusal::OutOfSlice,
        ]
        .into_iter()
        .find(|r| r.name() == s)
    }
}

/// What replaying a fixture must give.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Expect {
    /// Decodes, passes the source audit, and remaps (the remapped capture passes the destination
    /// audit and remapping back restores the capture byte for byte).
    Remap,
    /// Refused, for this reason.
    Refuse(Refusal),
}

/// A fixture's manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// Directory name.
    pub name: String,
    /// Generation.
    pub gen: Gen,
    /// Engine the capture submits to.
    pub engine: Engine,
    /// One line on what the fixture covers.
    pub description: String,
    /// Source aperture slice.
    pub src_aperture: SliceSpec,
    /// Source hidden slice.
    pub src_hidden: SliceSpec,
    /// Destination aperture slice.
    pub dst_aperture: SliceSpec,
    /// Destination hidden slice.
    pub dst_hidden: SliceSpec,
    /// Expected outcome.
    pub expect: Expect,
}

/// Manifest spelling of a generation.
#[must_use]
pub fn gen_name(gen: Gen) -> &'static str {
    match gen {
        Gen::Gen8 => "8",
        Gen::Gen9 => "9",
        Gen::Gen11 => "11",
    }
}

/// Manifest spelling of an engine.
#[must_use]
pub fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Render => "render",
        Engine::Blitter => "blitter",
        Engine::Video => "video",
        Engine::VideoEnhance => "video-enhance",
    }
}

/// First line of every manifest the generator writes (hand-made fixtures have another).
pub const GENERATED_HEADER: &str =
    "# gmig fixture manifest (docs/fixtures.md); generated, do not edit by hand\n";

impl Manifest {
    /// Parse `key = value` lines (`#` starts a comment; values may be quoted).
    ///
    /// # Errors
    /// [`FixtureError::Manifest`] naming the line.
    pub fn parse(text: &str) -> Result<Self, FixtureError> {
        let bad = |line: usize, reason: String| FixtureError::Manifest { line, reason };
        let mut kv = std::collections::BTreeMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split_once('#').map_or(raw, |(l, _)| l).trim();
            if line.is_empty() {
                continue;
            }
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| bad(i + 1, format!("expected `key = value`, found {line:?}")))?;
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            kv.insert(k.trim().to_owned(), (i + 1, v.to_owned()));
        }
        let get = |k: &str| {
            kv.get(k)
                .ok_or_else(|| bad(0, format!("missing key `{k}`")))
        };
        let slice = |k: &str| {
            let (l, v) = get(k)?;
            SliceSpec::parse(v).ok_or_else(|| bad(*l, format!("`{k}` is not BASE+SIZE: {v:?}")))
        };
        let (gl, g) = get("gen")?;
        let gen = match g.as_str() {
            "8" => Gen::Gen8,
            "9" => Gen::Gen9,
            "11" => Gen::Gen11,
            _ => return Err(bad(*gl, format!("unknown gen {g:?} (8, 9 or 11)"))),
        };
        let (el, e) = get("engine")?;
        let engine = [
            Engine::Render,
            Engine::Blitter,
            Engine::Video,
            Engine::VideoEnhance,
        ]
        .into_iter()
        .find(|x| engine_name(*x) == e)
        .ok_or_else(|| bad(*el, format!("unknown engine {e:?}")))?;
        let (xl, x) = get("expect")?;
        let expect = match x.as_str() {
            "remap" => Expect::Remap,
            "refuse" => {
                let (rl, r) = get("refusal")?;
                Expect::Refuse(
                    Refusal::parse(r).ok_or_else(|| bad(*rl, format!("unknown refusal {r:?}")))?,
                )
            }
            _ => {
                return Err(bad(
                    *xl,
                    format!("expect must be \"remap\" or \"refuse\", not {x:?}"),
                ))
            }
        };
        Ok(Self {
            name: get("name")?.1.clone(),
            gen,
            engine,
            description: kv
                .get("description")
                .map(|(_, v)| v.clone())
                .unwrap_or_default(),
            src_aperture: slice("source_aperture")?,
            src_hidden: slice("source_hidden")?,
            dst_aperture: slice("dest_aperture")?,
            dst_hidden: slice("dest_hidden")?,
            expect,
        })
    }

    /// The manifest as text ([`Manifest::parse`] reads it back).
    #[must_use]
    pub fn to_text(&self) -> String {
        let mut s = String::from(GENERATED_HEADER);
        let _ = writeln!(s, "name = \"{}\"", self.name);
        let _ = writeln!(s, "gen = {}", gen_name(self.gen));
        let _ = writeln!(s, "engine = \"{}\"", engine_name(self.engine));
        let _ = writeln!(
            s,
            "description = \"{}\"",
            self.description.replace('"', "'")
        );
        let _ = writeln!(s, "source_aperture = \"{}\"", self.src_aperture.text());
        let _ = writeln!(s, "source_hidden = \"{}\"", self.src_hidden.text());
        let _ = writeln!(s, "dest_aperture = \"{}\"", self.dst_aperture.text());
        let _ = writeln!(s, "dest_hidden = \"{}\"", self.dst_hidden.text());
        match self.expect {
            Expect::Remap => s.push_str("expect = \"remap\"\n"),
            Expect::Refuse(r) => {
                s.push_str("expect = \"refuse\"\n");
                let _ = writeln!(s, "refusal = \"{}\"", r.name());
            }
        }
        s
    }
}

// ------------------------------------------------------------------------------------------------
// The fixture set
// ------------------------------------------------------------------------------------------------

/// Source aperture slice of every fixture: 64 MiB at 64 MiB.
pub const SRC_APERTURE: SliceSpec = SliceSpec {
    base: 0x0400_0000,
    size: 0x0400_0000,
};
/// Source hidden slice of every fixture: 384 MiB at 1 GiB.
pub const SRC_HIDDEN: SliceSpec = SliceSpec {
    base: 0x4000_0000,
    size: 0x1800_0000,
};
/// Destination aperture slice: 64 MiB at 128 MiB.
pub const DST_APERTURE: SliceSpec = SliceSpec {
    base: 0x0800_0000,
    size: 0x0400_0000,
};
/// Destination hidden slice: 384 MiB at 1.5 GiB.
pub const DST_HIDDEN: SliceSpec = SliceSpec {
    base: 0x6000_0000,
    size: 0x1800_0000,
};

const AP: u64 = SRC_APERTURE.base;
const HID: u64 = SRC_HIDDEN.base;
const RING: u64 = AP;
const CONTEXT: u64 = AP + 0x1000;
const BATCH: u64 = AP + 0x1_0000;
const BATCH2: u64 = AP + 0x1_1000;
const BATCH3: u64 = AP + 0x1_2000;
const PP_BATCH: u64 = 0x0000_7f00_0010_0000;
const PP_DATA: u64 = 0x0000_7f00_0020_0000;
/// A register the audit allows (render engine general-purpose register 0).
const GPR0: u32 = 0x2600;

/// One fixture's source: its manifest and how its capture is built.
#[derive(Clone, Copy)]
pub struct FixtureSpec {
    /// Directory name.
    pub name: &'static str,
    /// Generation.
    pub gen: Gen,
    /// Engine.
    pub engine: Engine,
    /// What it covers.
    pub description: &'static str,
    /// Expected outcome.
    pub expect: Expect,
    build: fn(&mut CaptureBuilder, Engine) -> Result<(), AubError>,
    /// Cut the capture to this many bytes from its end (the truncated-capture fixture).
    pub cut_tail: usize,
}

impl std::fmt::Debug for FixtureSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixtureSpec")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl FixtureSpec {
    /// The manifest.
    #[must_use]
    pub fn manifest(&self) -> Manifest {
        Manifest {
            name: self.name.to_owned(),
            gen: self.gen,
            engine: self.engine,
            description: self.description.to_owned(),
            src_aperture: SRC_APERTURE,
            src_hidden: SRC_HIDDEN,
            dst_aperture: DST_APERTURE,
            dst_hidden: DST_HIDDEN,
            expect: self.expect,
        }
    }

    /// The capture bytes.
    ///
    /// # Errors
    /// [`FixtureError::Build`].
    pub fn capture(&self) -> Result<Vec<u8>, FixtureError> {
        let err = |source| FixtureError::Build {
            name: self.name.to_owned(),
            source,
        };
        let mut b = CaptureBuilder::new(self.gen, &format!("gmig fixture {}", self.name));
        (self.build)(&mut b, self.engine).map_err(err)?;
        let mut bytes = b.finish().to_bytes().map_err(err)?;
        bytes.truncate(bytes.len().saturating_sub(self.cut_tail));
        Ok(bytes)
    }
}

/// Submit `ring` commands on `engine` with the fixtures' ring and context placement.
fn run_ring(b: &mut CaptureBuilder, engine: Engine, ring: &[u32]) -> Result<(), AubError> {
    let spec = RingSpec {
        ring: GgttOffset(RING),
        ring_size: PAGE_SIZE,
        commands: ring,
        context: GgttOffset(CONTEXT),
    };
    b.submit(engine, &spec)?;
    Ok(())
}

/// Place `batch` at GGTT `at` and run it from the ring as a privileged (GGTT) first-level batch.
fn run_ggtt_batch(
    b: &mut CaptureBuilder,
    engine: Engine,
    at: u64,
    batch: &[u32],
) -> Result<(), AubError> {
    b.write_ggtt_dwords(GgttOffset(at), batch)?;
    let mut ring = cmd::bb_start(at, false, false).to_vec();
    ring.push(cmd::MI_NOOP);
    run_ring(b, engine, &ring)
}

/// Place `batch` at PPGTT `at` and run it from the ring as a non-privileged (PPGTT) batch.
fn run_ppgtt_batch(
    b: &mut CaptureBuilder,
    engine: Engine,
    at: u64,
    batch: &[u32],
) -> Result<(), AubError> {
    b.write_ppgtt_dwords(at, batch)?;
    let mut ring = cmd::bb_start(at, true, false).to_vec();
    ring.push(cmd::MI_NOOP);
    run_ring(b, engine, &ring)
}

/// Map (and fill with a pattern) a data buffer in the GGTT.
fn ggtt_buffer(b: &mut CaptureBuilder, at: u64, len: usize, seed: u8) -> Result<(), AubError> {
    let data: Vec<u8> = (0..len).map(|i| seed.wrapping_add(i as u8)).collect();
    b.write_ggtt(GgttOffset(at), &data)
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.iter().flat_map(|p| p.iter().copied()).collect()
}

fn mi_stores(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    ggtt_buffer(b, HID + 0x4000, 64, 1)?;
    let batch = cat(&[
        &cmd::store_data_imm(HID + 0x4000, true, 0xcafe_f00d),
        &cmd::load_register_imm(&[(GPR0, 0x1234_5678)]),
        &cmd::store_register_mem(GPR0, HID + 0x4008, true),
        &cmd::load_register_mem(GPR0, HID + 0x4010, true),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    run_ggtt_batch(b, e, BATCH, &batch)
}

fn pipe_control(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    ggtt_buffer(b, HID + 0x8000, 32, 2)?;
    b.write_ppgtt_dwords(PP_DATA, &[0; 8])?;
    let batch = cat(&[
        &cmd::pipe_control_write(HID + 0x8000, true, 0x1111_2222_3333_4444),
        &cmd::pipe_control_write(PP_DATA, false, 5),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    run_ggtt_batch(b, e, BATCH, &batch)
}

fn pipe_control_ppgtt(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    b.write_ppgtt_dwords(PP_DATA, &[0; 8])?;
    let batch = cat(&[
        &cmd::pipe_control_write(PP_DATA, false, 7),
        &cmd::store_data_imm(PP_DATA + 8, false, 9),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    run_ppgtt_batch(b, e, PP_BATCH, &batch)
}

fn xy_blits(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    ggtt_buffer(b, AP + 0x2_0000, 256, 3)?;
    ggtt_buffer(b, HID + 0x1_0000, 256, 4)?;
    let batch = cat(&[
        &cmd::xy_src_copy_blt(HID + 0x1_0000, 64, AP + 0x2_0000, 64, 16, 4),
        &cmd::xy_color_blt(HID + 0x2_0000, 256, 64, 8, 0xff00_ff00),
        &cmd::flush_dw_write(HID + 0x3_0000, true, 1),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    run_ggtt_batch(b, e, BATCH, &batch)
}

fn ppgtt_blit(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    b.write_ppgtt(PP_DATA, &[0x5a; 256])?;
    let batch = cat(&[
        &cmd::xy_src_copy_blt(PP_DATA + 0x1000, 64, PP_DATA, 64, 16, 4),
        &[cmd::MI_BATCH_BUFFER_END, cmd::MI_NOOP],
    ]);
    run_ppgtt_batch(b, e, PP_BATCH, &batch)
}

fn ring_flush_dw(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    ggtt_buffer(b, HID + 0x5000, 16, 5)?;
    let ring = cat(&[
        &cmd::flush_dw_write(HID + 0x5000, true, 0xabcd),
        &cmd::store_data_imm(HID + 0x5008, true, 0x77),
        &[cmd::MI_NOOP, cmd::MI_NOOP, cmd::MI_NOOP],
    ]);
    run_ring(b, e, &ring)
}

fn video_flush_dw(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    ggtt_buffer(b, HID + 0x6000, 16, 6)?;
    b.write_ppgtt_dwords(PP_DATA, &[0; 4])?;
    let batch = cat(&[
        &cmd::flush_dw_write(HID + 0x6000, true, 0x1),
        &cmd::flush_dw_write(PP_DATA, false, 0x2),
        &cmd::store_data_imm(HID + 0x6008, true, 0x3),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    run_ggtt_batch(b, e, BATCH, &batch)
}

fn video_ppgtt(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    b.write_ppgtt_dwords(PP_DATA, &[0; 4])?;
    let batch = cat(&[
        &cmd::flush_dw_write(PP_DATA, false, 0x10),
        &cmd::store_data_imm(PP_DATA + 8, false, 0x20),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    run_ppgtt_batch(b, e, PP_BATCH, &batch)
}

fn vecs_stores(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    ggtt_buffer(b, AP + 0x3_0000, 16, 7)?;
    let batch = cat(&[
        &cmd::flush_dw_write(AP + 0x3_0000, true, 0x99),
        &cmd::store_data_imm(HID + 0x7000, true, 0x98),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    run_ggtt_batch(b, e, BATCH, &batch)
}

fn three_d(b: &mut CaptureBuilder, e: Engine, ppgtt: bool) -> Result<(), AubError> {
    let gen = b.gen();
    let (state, vb, ib) = if ppgtt {
        (PP_DATA, PP_DATA + 0x1_0000, PP_DATA + 0x2_0000)
    } else {
        (HID + 0x10_0000, HID + 0x20_0000, HID + 0x21_0000)
    };
    if ppgtt {
        b.write_ppgtt(vb, &[0x3c; 48])?;
        b.write_ppgtt(ib, &[0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0])?;
    } else {
        ggtt_buffer(b, vb, 48, 8)?;
        ggtt_buffer(b, ib, 12, 0)?;
    }
    let batch = cat(&[
        &cmd::state_base_address(gen, state),
        &cmd::vertex_buffers(0, vb, 48, 16),
        &cmd::index_buffer(ib, 12),
        &cmd::primitive(3),
        &cmd::pipe_control_write(
            if ppgtt {
                PP_DATA + 0x3_0000
            } else {
                HID + 0x30_0000
            },
            !ppgtt,
            1,
        ),
        &[cmd::MI_BATCH_BUFFER_END, cmd::MI_NOOP],
    ]);
    if ppgtt {
        run_ppgtt_batch(b, e, PP_BATCH, &batch)
    } else {
        run_ggtt_batch(b, e, BATCH, &batch)
    }
}

fn chained(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    let second = cat(&[
        &cmd::store_data_imm(HID + 0x9000, true, 2),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    let chained_to = cat(&[
        &cmd::store_data_imm(HID + 0x9008, true, 3),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    let first = cat(&[
        &cmd::store_data_imm(HID + 0x9010, true, 1),
        &cmd::bb_start(BATCH3, false, true),
        &cmd::bb_start(BATCH2, false, false),
    ]);
    b.write_ggtt_dwords(GgttOffset(BATCH3), &second)?;
    b.write_ggtt_dwords(GgttOffset(BATCH2), &chained_to)?;
    run_ggtt_batch(b, e, BATCH, &first)
}

fn self_loop(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    let batch = cat(&[
        &cmd::xy_color_blt(HID, 64, 16, 1, 0),
        &cmd::bb_start(BATCH, false, false),
    ]);
    run_ggtt_batch(b, e, BATCH, &batch)
}

fn forbidden_semaphore(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    let batch = cat(&[
        &cmd::store_data_imm(HID + 0xa000, true, 1),
        &cmd::semaphore_wait(HID + 0xa000, 1),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    run_ggtt_batch(b, e, BATCH, &batch)
}

fn forbidden_update_gtt(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    let batch = cat(&[&cmd::update_gtt(0, 0x1000 | 1), &[cmd::MI_BATCH_BUFFER_END]]);
    run_ggtt_batch(b, e, BATCH, &batch)
}

fn out_of_slice(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    // 0x2000_0000 lies between the aperture slice (ends at 128 MiB) and the hidden slice (1 GiB).
    let batch = cat(&[
        &cmd::xy_color_blt(HID + 0x1000, 64, 16, 1, 0),
        &cmd::xy_color_blt(0x2000_0000, 64, 16, 1, 0),
        &[cmd::MI_BATCH_BUFFER_END],
    ]);
    run_ggtt_batch(b, e, BATCH, &batch)
}

fn truncated_ring(b: &mut CaptureBuilder, e: Engine) -> Result<(), AubError> {
    // The ring's tail ends four dwords into a six-dword PIPE_CONTROL.
    let pc = cmd::pipe_control_write(HID + 0xb000, true, 1);
    let ring = cat(&[&[cmd::MI_NOOP, cmd::MI_NOOP], &pc[..4]]);
    run_ring(b, e, &ring)
}

/// Every fixture, in directory-name order of generation then engine.
#[must_use]
pub fn specs() -> Vec<FixtureSpec> {
    use Engine::{Blitter, Render, Video, VideoEnhance};
    use Gen::{Gen11, Gen8, Gen9};
    type Build = fn(&mut CaptureBuilder, Engine) -> Result<(), AubError>;
    fn s(
        name: &'static str,
        gen: Gen,
        engine: Engine,
        description: &'static str,
        expect: Expect,
        build: Build,
    ) -> FixtureSpec {
        FixtureSpec {
            name,
            gen,
            engine,
            description,
            expect,
            build,
            cut_tail: 0,
        }
    }
    let remap = Expect::Remap;
    let refuse = Expect::Refuse;
    vec![
        s("gen8-render-mi-stores", Gen8, Render,
          "MI_STORE_DATA_IMM, MI_LOAD_REGISTER_IMM, MI_STORE_REGISTER_MEM, MI_LOAD_REGISTER_MEM to GGTT in a privileged batch",
          remap, mi_stores),
        s("gen8-blitter-ppgtt-blit", Gen8, Blitter,
          "XY_SRC_COPY_BLT between PPGTT buffers in a non-privileged batch: nothing to rebase but ring and context",
          remap, ppgtt_blit),
        s("gen8-video-flush-dw", Gen8, Video,
          "MI_FLUSH_DW post-sync writes to GGTT and PPGTT, MI_STORE_DATA_IMM, privileged batch",
          remap, video_flush_dw),
        s("gen8-video-enhance-ring-flush", Gen8, VideoEnhance,
          "MI_FLUSH_DW and MI_STORE_DATA_IMM to GGTT directly in the ring",
          remap, ring_flush_dw),
        s("gen8-blitter-self-loop", Gen8, Blitter,
          "a batch that chains to itself: the walk budget must end it",
          refuse(Refusal::Budget), self_loop),
        s("gen8-render-truncated-ring", Gen8, Render,
          "the ring tail cuts a PIPE_CONTROL after four of its six dwords",
          refuse(Refusal::Truncated), truncated_ring),
        s("gen9-render-pipe-control", Gen9, Render,
          "PIPE_CONTROL post-sync writes to GGTT (DW1 bit 24) and PPGTT from a privileged batch",
          remap, pipe_control),
        s("gen9-render-3d-privileged", Gen9, Render,
          "STATE_BASE_ADDRESS, 3DSTATE_VERTEX_BUFFERS, 3DSTATE_INDEX_BUFFER, 3DPRIMITIVE in a privileged (GGTT) batch",
          remap, |b, e| three_d(b, e, false)),
        s("gen9-render-chained-second-level", Gen9, Render,
          "a first-level batch calls a second-level batch, then chains to another first-level batch",
          remap, chained),
        s("gen9-render-forbidden-semaphore", Gen9, Render,
          "MI_SEMAPHORE_WAIT, which a mediated parser must refuse",
          refuse(Refusal::Forbidden), forbidden_semaphore),
        s("gen9-blitter-xy-blits", Gen9, Blitter,
          "XY_SRC_COPY_BLT aperture to hidden, XY_COLOR_BLT, MI_FLUSH_DW post-sync to GGTT",
          remap, xy_blits),
        s("gen9-video-ppgtt-batch", Gen9, Video,
          "MI_FLUSH_DW and MI_STORE_DATA_IMM to PPGTT from a non-privileged batch",
          remap, video_ppgtt),
        FixtureSpec {
            cut_tail: 10,
            ..s("gen9-video-enhance-truncated-capture", Gen9, VideoEnhance,
                "the AUB capture itself ends in the middle of its last packet",
                refuse(Refusal::Aub), vecs_stores)
        },
        s("gen11-render-3d-ppgtt", Gen11, Render,
          "STATE_BASE_ADDRESS, vertex and index buffers, 3DPRIMITIVE, PIPE_CONTROL in a non-privileged (PPGTT) batch",
          remap, |b, e| three_d(b, e, true)),
        s("gen11-render-pipe-control-ppgtt", Gen11, Render,
          "PIPE_CONTROL and MI_STORE_DATA_IMM to PPGTT from a non-privileged batch",
          remap, pipe_control_ppgtt),
        s("gen11-blitter-out-of-slice", Gen11, Blitter,
          "XY_COLOR_BLT to a GGTT address outside both slices of the vGPU",
          refuse(Refusal::OutOfSlice), out_of_slice),
        s("gen11-blitter-ring-flush", Gen11, Blitter,
          "MI_FLUSH_DW and MI_STORE_DATA_IMM to GGTT directly in the ring",
          remap, ring_flush_dw),
        s("gen11-video-forbidden-update-gtt", Gen11, Video,
          "MI_UPDATE_GTT, which a mediated parser must refuse",
          refuse(Refusal::Forbidden), forbidden_update_gtt),
        s("gen11-video-enhance-stores", Gen11, VideoEnhance,
          "MI_FLUSH_DW post-sync to the aperture slice, MI_STORE_DATA_IMM to the hidden slice",
          remap, vecs_stores),
    ]
}

// ------------------------------------------------------------------------------------------------
// Replay
// ------------------------------------------------------------------------------------------------

/// The budget fixtures are replayed with (small, so the self-looping batch ends at once).
pub const REPLAY_BUDGET: Budget = Budget {
    max_commands: 4096,
    max_batch_bytes: 1 << 20,
    max_batches: 64,
};

/// What replaying a fixture gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The capture audited clean and was remapped.
    Remapped {
        /// The remapped capture.
        aub: Vec<u8>,
        /// Its listing.
        listing: String,
        /// GGTT address fields rewritten, over all submissions.
        ggtt_rewritten: u64,
    },
    /// The capture was refused.
    Refused {
        /// Why, in the manifest's terms.
        refusal: Refusal,
        /// The library's message.
        message: String,
    },
}

/// A fixture replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Listing of the capture.
    pub decode: String,
    /// What happened.
    pub outcome: Outcome,
}

impl Replay {
    /// Whether the outcome is the one the manifest expects.
    #[must_use]
    pub fn matches(&self, expect: Expect) -> bool {
        match (&self.outcome, expect) {
            (Outcome::Remapped { .. }, Expect::Remap) => true,
            (Outcome::Refused { refusal, .. }, Expect::Refuse(r)) => *refusal == r,
            _ => false,
        }
    }

    /// The outcome in manifest terms (`remap`, or `refuse: <reason>`).
    #[must_use]
    pub fn outcome_text(&self) -> String {
        match &self.outcome {
            Outcome::Remapped { .. } => "remap".to_owned(),
            Outcome::Refused { refusal, message } => {
                format!("refuse ({}): {message}", refusal.name())
            }
        }
    }

    /// The expected files this replay gives (name, bytes), decode first.
    #[must_use]
    pub fn expected_files(&self) -> Vec<(String, Vec<u8>)> {
        let mut v = vec![(
            "expected-decode.txt".to_owned(),
            self.decode.clone().into_bytes(),
        )];
        match &self.outcome {
            Outcome::Remapped { aub, listing, .. } => {
                v.push(("expected-remap.aub".to_owned(), aub.clone()));
                v.push((
                    "expected-remap.txt".to_owned(),
                    listing.clone().into_bytes(),
                ));
            }
            Outcome::Refused { message, .. } => {
                v.push((
                    "expected-refusal.txt".to_owned(),
                    format!("{message}\n").into_bytes(),
                ));
            }
        }
        v
    }
}

fn slices(a: SliceSpec, h: SliceSpec) -> Result<VgpuSlices, String> {
    let s = |x: SliceSpec| Slice::new(GgttOffset(x.base), x.size).map_err(|e| e.to_string());
    let v = VgpuSlices {
        aperture: s(a)?,
        hidden: s(h)?,
    };
    v.validate().map_err(|e| e.to_string())?;
    Ok(v)
}

impl Manifest {
    /// The slice move the manifest names.
    ///
    /// # Errors
    /// [`FixtureError::Manifest`] when the slices are invalid or differ in size.
    pub fn slice_move(&self) -> Result<SliceMove, FixtureError> {
        let bad = |reason: String| FixtureError::Manifest { line: 0, reason };
        let from = slices(self.src_aperture, self.src_hidden).map_err(bad)?;
        let to = slices(self.dst_aperture, self.dst_hidden).map_err(bad)?;
        SliceMove::new(from, to).map_err(|e| bad(e.to_string()))
    }
}

fn classify_audit(e: &AuditError) -> Refusal {
    match e {
        AuditError::OutOfSlice { .. } | AuditError::SurfaceTooLarge { .. } => Refusal::OutOfSlice,
        _ => Refusal::Forbidden,
    }
}

/// The refusal reason of a walk error.
#[must_use]
// Wildcards keep this compiling when the parser's (non-exhaustive) error enums grow.
#[allow(unreachable_patterns, clippy::match_same_arms)]
pub fn classify_walk(e: &WalkError) -> Refusal {
    match e {
        WalkError::Decode {
            err: DecodeError::Truncated { .. },
            ..
        } => Refusal::Truncated,
        WalkError::Decode { .. } | WalkError::BadRing { .. } | WalkError::Memory(_) => {
            Refusal::Malformed
        }
        WalkError::Budget { .. } => Refusal::Budget,
        WalkError::Nesting { .. } | WalkError::Rejected { .. } => Refusal::Forbidden,
        WalkError::Audit { err, .. } => classify_audit(err),
        WalkError::Remap { err, .. } => match err {
            RemapError::Decode(DecodeError::Truncated { .. }) => Refusal::Truncated,
            RemapError::Source(a) => classify_audit(a),
            RemapError::Destination(_) | RemapError::Overflow { .. } => Refusal::OutOfSlice,
            _ => Refusal::Malformed,
        },
        _ => Refusal::Malformed,
    }
}

/// Decode, audit (source slices) and remap (source → destination) a capture as the manifest says.
///
/// A remap must also pass the destination audit and migrate back to the original bytes; if it
/// does not, that is a library fault, reported as [`FixtureError::Outcome`].
///
/// # Errors
/// [`FixtureError`] for a bad manifest or a remap that breaks its guarantees.
pub fn replay(manifest: &Manifest, capture: &[u8]) -> Result<Replay, FixtureError> {
    let fault = |reason: String| FixtureError::Outcome {
        name: manifest.name.clone(),
        reason,
    };
    let mv = manifest.slice_move()?;
    let gen = Some(manifest.gen);
    let decode = listing::to_text(&listing::list_capture(capture, gen, REPLAY_BUDGET));
    let refused = |refusal, message: String| {
        Ok(Replay {
            decode: decode.clone(),
            outcome: Outcome::Refused { refusal, message },
        })
    };
    let cap = match AubCapture::parse(capture) {
        Ok(c) => c,
        Err(e) => return refused(Refusal::Aub, e.to_string()),
    };
    if cap.gen != gen {
        return Err(fault(format!(
            "capture is for {:?}, manifest says {:?}",
            cap.gen, manifest.gen
        )));
    }
    for (i, s) in cap.submissions.iter().enumerate() {
        if s.engine != manifest.engine {
            return Err(fault(format!(
                "submission {i} runs on {:?}, manifest says {:?}",
                s.engine, manifest.engine
            )));
        }
        if let Err(e) = audit_walk(
            manifest.gen,
            s.engine,
            &s.memory(&cap.memory),
            s.ring_span(),
            REPLAY_BUDGET,
            &mv.from,
        ) {
            return refused(classify_walk(&e), format!("submission {i}: {e}"));
        }
    }
    let moved = match cap.migrate(&mv, REPLAY_BUDGET) {
        Ok(m) => m,
        Err(e) => {
            let r = match &e {
                AubError::Walk { err, .. } => classify_walk(err),
                AubError::NotInSlice { .. } | AubError::EntryCollision { .. } => {
                    Refusal::OutOfSlice
                }
                _ => Refusal::Malformed,
            };
            return refused(r, e.to_string());
        }
    };
    let mut ggtt_rewritten = 0;
    for (i, s) in moved.submissions.iter().enumerate() {
        let rep = audit_walk(
            manifest.gen,
            s.engine,
            &s.memory(&moved.memory),
            s.ring_span(),
            REPLAY_BUDGET,
            &mv.to,
        )
        .map_err(|e| {
            fault(format!(
                "remapped submission {i} fails the destination audit: {e}"
            ))
        })?;
        ggtt_rewritten += rep.ggtt_uses;
    }
    let aub = moved.to_bytes().map_err(|e| fault(e.to_string()))?;
    // There and back is the identity on the capture (bytes too, for captures in the canonical
    // form `AubCapture::to_bytes` writes, as every generated fixture is).
    let back = moved
        .migrate(&mv.inverse(), REPLAY_BUDGET)
        .map_err(|e| fault(format!("migrating back failed: {e}")))?;
    if back != cap {
        return Err(fault(
            "migrating back does not restore the capture".to_owned(),
        ));
    }
    let listing = listing::to_text(&listing::list_capture(&aub, gen, REPLAY_BUDGET));
    Ok(Replay {
        decode,
        outcome: Outcome::Remapped {
            aub,
            listing,
            ggtt_rewritten,
        },
    })
}

/// Every file of a fixture (name, bytes): manifest, capture, and the expected files of its replay.
///
/// # Errors
/// [`FixtureError`] when building fails or the replay's outcome is not the one the spec expects.
pub fn generate(spec: &FixtureSpec) -> Result<Vec<(String, Vec<u8>)>, FixtureError> {
    let manifest = spec.manifest();
    let capture = spec.capture()?;
    let r = replay(&manifest, &capture)?;
    if !r.matches(spec.expect) {
        return Err(FixtureError::Outcome {
            name: spec.name.to_owned(),
            reason: format!(
                "expected {:?}, replay gave {}",
                spec.expect,
                r.outcome_text()
            ),
        });
    }
    let mut files = vec![
        ("manifest.toml".to_owned(), manifest.to_text().into_bytes()),
        ("capture.aub".to_owned(), capture),
    ];
    files.extend(r.expected_files());
    Ok(files)
}

/// What [`check_dir`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// The manifest.
    pub manifest: Manifest,
    /// The replay.
    pub replay: Replay,
}

/// Why a fixture directory does not check out.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The manifest or the replay is unusable.
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    /// The replay differs from the files checked in.
    #[error("{name}: {}", differences.join("; "))]
    Differs {
        /// Fixture name.
        name: String,
        /// What differs.
        differences: Vec<String>,
    },
}

/// Replay the fixture in `dir` (or the directory of the manifest `dir` names) and compare the outcome
/// with its manifest and every expected file with the replay's.
///
/// # Errors
/// [`CheckError::Differs`] listing every difference, or why the fixture could not be replayed.
pub fn check_dir(dir: &std::path::Path) -> Result<CheckReport, CheckError> {
    let dir = if dir.is_file() {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    };
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|source| CheckError::Io {
            path: path.display().to_string(),
            source,
        })
    };
    let manifest = Manifest::parse(&String::from_utf8_lossy(&read("manifest.toml")?))?;
    let capture = read("capture.aub")?;
    let r = replay(&manifest, &capture)?;
    let mut differences = Vec::new();
    if !r.matches(manifest.expect) {
        differences.push(format!(
            "manifest expects {:?}, replay gave {}",
            manifest.expect,
            r.outcome_text()
        ));
    }
    for (name, bytes) in r.expected_files() {
        match std::fs::read(dir.join(&name)) {
            Ok(disk) if disk == bytes => {}
            Ok(disk) => differences.push(first_difference(&name, &disk, &bytes)),
            Err(e) => differences.push(format!("{name}: {e}")),
        }
    }
    if differences.is_empty() {
        Ok(CheckReport {
            manifest,
            replay: r,
        })
    } else {
        Err(CheckError::Differs {
            name: manifest.name,
            differences,
        })
    }
}

fn first_difference(name: &str, expected: &[u8], got: &[u8]) -> String {
    let at = expected
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(expected.len().min(got.len()));
    if name.ends_with(".txt") {
        let line = expected
            .get(..at)
            .map_or(0, |p| p.iter().filter(|&&b| b == b'\n').count())
            + 1;
        let show = |b: &[u8]| {
            String::from_utf8_lossy(b)
                .lines()
                .nth(line - 1)
                .unwrap_or("<end>")
                .to_owned()
        };
        format!(
            "{name} line {line}: expected {:?}, replay gives {:?}",
            show(expected),
            show(got)
        )
    } else {
        format!(
            "{name} differs from byte 0x{at:x} ({} bytes expected, {} given)",
            expected.len(),
            got.len()
        )
    }
}
