//! `gmig decode`: an aubinator-like listing of an AUB capture or of raw dwords.

use anyhow::Context as _;
use gmig_cmdparser::aub::listing::{self, CommandLine, ListingItem};
use gmig_cmdparser::aub::{dwords_of, fixture};
use gmig_cmdparser::{Engine, Gen};
use serde_json::{json, Value};

use crate::cli::{DecodeArgs, EngineArg, GenArg};
use crate::exit::Failure;

/// Largest file `gmig decode` reads (1 GiB).
const MAX_FILE: u64 = 1 << 30;

/// The library's generation for a command-line one.
pub fn gen_of(g: GenArg) -> Gen {
    match g {
        GenArg::Gen8 => Gen::Gen8,
        GenArg::Gen9 => Gen::Gen9,
        GenArg::Gen11 => Gen::Gen11,
    }
}

/// The library's engine for a command-line one.
pub fn engine_of(e: EngineArg) -> Engine {
    match e {
        EngineArg::Render => Engine::Render,
        EngineArg::Blitter => Engine::Blitter,
        EngineArg::Video => Engine::Video,
        EngineArg::VideoEnhance => Engine::VideoEnhance,
    }
}

/// Run `gmig decode`.
pub fn run(args: &DecodeArgs, json: bool) -> Result<(), Failure> {
    let len = std::fs::metadata(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?
        .len();
    if len > MAX_FILE {
        return Err(anyhow::anyhow!(
            "{} is {len} bytes; gmig decode reads at most {MAX_FILE}",
            args.file.display()
        )
        .into());
    }
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let items = if args.raw {
        if bytes.len() % 4 != 0 {
            return Err(anyhow::anyhow!(
                "{} is {} bytes, not a whole number of dwords",
                args.file.display(),
                bytes.len()
            )
            .into());
        }
        let gen = gen_of(args.generation.unwrap_or(GenArg::Gen9));
        let engine = engine_of(args.engine.unwrap_or(EngineArg::Render));
        listing::list_raw(gen, engine, &dwords_of(&bytes))
    } else {
        let items =
            listing::list_capture(&bytes, args.generation.map(gen_of), listing::LISTING_BUDGET);
        match args.engine {
            Some(e) => only_engine(items, engine_of(e)),
            None => items,
        }
    };
    let errored = items.iter().any(|i| matches!(i, ListingItem::Error { .. }));
    let nothing = if args.raw {
        bytes.is_empty()
    } else {
        !items
            .iter()
            .any(|i| matches!(i, ListingItem::Submission { .. }))
    };
    if nothing && !errored {
        let what = match (args.raw, args.engine) {
            (true, _) => "no dwords to decode".to_owned(),
            (false, Some(e)) => format!("no submissions to the {e:?} engine"),
            (false, None) => "no submissions".to_owned(),
        };
        return Err(
            anyhow::anyhow!("{} ({} bytes): {what}", args.file.display(), bytes.len()).into(),
        );
    }
    if json {
        for item in &items {
            println!("{}", item_json(item));
        }
    } else {
        print!("{}", listing::to_text(&items));
    }
    match items.iter().find_map(|i| match i {
        ListingItem::Error {
            submission,
            message,
        } => Some((submission, message)),
        _ => None,
    }) {
        Some((Some(s), m)) => Err(anyhow::anyhow!("decoding submission {s} stopped: {m}").into()),
        Some((None, m)) => Err(anyhow::anyhow!("decoding stopped: {m}").into()),
        None => Ok(()),
    }
}

/// Keep the header and the items of submissions to `engine`.
fn only_engine(items: Vec<ListingItem>, engine: Engine) -> Vec<ListingItem> {
    let mut keep_sub = Vec::new();
    for i in &items {
        if let ListingItem::Submission { index, submission } = i {
            if submission.engine == engine {
                keep_sub.push(*index);
            }
        }
    }
    items
        .into_iter()
        .filter(|i| match i {
            ListingItem::Header { .. } => true,
            ListingItem::Submission { index, .. } => keep_sub.contains(index),
            ListingItem::Command(CommandLine { submission, .. })
            | ListingItem::Error { submission, .. } => {
                submission.is_none_or(|s| keep_sub.contains(&s))
            }
        })
        .collect()
}

/// One listing item as a JSON object (one line of `--json` output).
pub fn item_json(item: &ListingItem) -> Value {
    match item {
        ListingItem::Header { gen, app_name } => json!({
            "type": "header",
            "gen": gen.map(fixture::gen_name),
            "app_name": app_name,
        }),
        ListingItem::Submission {
            index,
            submission: s,
        } => json!({
            "type": "submission",
            "index": index,
            "engine": fixture::engine_name(s.engine),
            "descriptor": format!("0x{:016x}", s.descriptor),
            "context": s.lrca.0,
            "ring": { "start": s.ring.start.0, "size": s.ring.size, "head": s.ring.head, "tail": s.ring.tail },
            "pml4": s.pml4,
        }),
        ListingItem::Command(c) => json!({
            "type": "command",
            "submission": c.submission,
            "level": listing::level_name(c.level),
            "space": c.space.to_string(),
            "addr": c.addr,
            "offset": c.offset * 4,
            "name": c.name,
            "dwords": c.dwords,
            "addresses": c.addresses.iter().map(|u| json!({
                "dword": u.dword,
                "field": u.name,
                "space": u.space.to_string(),
                "addr": u.addr,
                "access": listing::access_name(u.access),
                "start": u.start,
                "len": u.len,
                "bounded": u.bounded,
            })).collect::<Vec<_>>(),
            "footprint": c.footprint,
        }),
        ListingItem::Error {
            submission,
            message,
        } => json!({
            "type": "error",
            "submission": submission,
            "message": message,
        }),
    }
}
