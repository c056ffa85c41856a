//! Compares the command tables with Mesa's genxml (`../shared/genxml/gen{8,9,11}.xml`), when
//! present: for every command both describe, the opcode (by looking genxml's DW0 up in our
//! tables and comparing names), the length bias and field width, the fixed length, and the dword
//! positions, lowest bits and repeat strides of `type="address"` fields (those of the instruction,
//! of structures it embeds, and of arrays of structures).
//!
//! Differences that are deliberate are listed in [`KNOWN`] with the reason; anything else fails.

use std::collections::BTreeSet;
use std::path::PathBuf;

use gmig_cmdparser::{lookup, Engine, Gen, LengthRule};

/// (generation or 0 for all, command, what differs, why).
const KNOWN: &[(u8, &str, &str, &str)] = &[
    (0, "MEDIA_OBJECT", "address", "DW3 'Indirect Data Start Address' is an offset from the indirect object base, not a graphics address"),
    (0, "MEDIA_OBJECT_GRPID", "address", "DW3 'Indirect Data Start Address' is an offset from the indirect object base, not a graphics address"),
    (0, "MEDIA_VFE_STATE", "address", "'Scratch Space Base Pointer' is an offset from the general state base, not a graphics address"),
    (0, "3DSTATE_VS", "address", "'Scratch Space Base Pointer' is an offset from the general state base"),
    (0, "3DSTATE_GS", "address", "'Scratch Space Base Pointer' is an offset from the general state base"),
    (0, "3DSTATE_HS", "address", "'Scratch Space Base Pointer' is an offset from the general state base"),
    (0, "3DSTATE_DS", "address", "'Scratch Space Base Pointer' is an offset from the general state base"),
    (0, "3DSTATE_PS", "address", "'Scratch Space Base Pointer' is an offset from the general state base"),
    (0, "MI_DISPLAY_FLIP", "address", "only the primary display address is modelled; the command is refused"),
    (11, "MEDIA_OBJECT", "length", "gen11 genxml gives a 15-bit DWord Length; we use GVT-g's 16-bit media mask (bit 15 is reserved)"),
    (11, "MEDIA_OBJECT_PRT", "length", "gen11 genxml gives a 15-bit DWord Length; we use GVT-g's 16-bit media mask"),
    (11, "MEDIA_OBJECT_WALKER", "length", "gen11 genxml gives a 15-bit DWord Length; we use GVT-g's 16-bit media mask"),
    (11, "HCP_RDOQ_STATE", "opcode", "gen11 genxml gives HCP_RDOQ_STATE the opcode of HCP_TILE_CODING; both are opaque video state"),
    (0, "MFX_WAIT", "length", "genxml: fixed 1 dword (bias 1); we keep GVT-g's 6-bit length mask (same length for valid DW0s)"),
];

static USED: std::sync::Mutex<BTreeSet<usize>> = std::sync::Mutex::new(BTreeSet::new());

fn known(gen: u8, name: &str, what: &str) -> bool {
    let hit = KNOWN
        .iter()
        .position(|(g, n, w, _)| (*g == 0 || *g == gen) && *n == name && *w == what);
    if let Some(i) = hit {
        USED.lock().unwrap().insert(i);
    }
    hit.is_some()
}

fn genxml_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GMIG_GENXML") {
        return Some(PathBuf::from(p));
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let p = manifest.join("../../../shared/genxml");
    p.join("gen9.xml").exists().then_some(p)
}

fn engines_of(attr: Option<&str>) -> Vec<Engine> {
    match attr {
        None => Engine::ALL.to_vec(),
        Some(a) => a
            .split('|')
            .filter_map(|e| match e {
                "render" => Some(Engine::Render),
                "blitter" => Some(Engine::Blitter),
                "video" => Some(Engine::Video),
                "videoenhancement" => Some(Engine::VideoEnhance),
                _ => None,
            })
            .collect(),
    }
}

fn num(s: &str) -> u64 {
    if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).unwrap_or(0)
    } else {
        s.parse().unwrap_or(0)
    }
}

/// An address field found in genxml: (dword, lowest bit, repeat stride in dwords).
type Addr = (usize, u8, Option<usize>);

/// Collects the address fields of `node` (an instruction, struct or group) at bit offset `base`,
/// following struct-typed fields and groups (a `count="0"` group repeats to the end of the
/// command: its first element is recorded with its stride).
fn collect(
    node: roxmltree::Node<'_, '_>,
    base: u64,
    repeat: Option<usize>,
    structs: &std::collections::HashMap<String, roxmltree::Node<'_, '_>>,
    out: &mut BTreeSet<Addr>,
    depth: u32,
) {
    if depth > 8 {
        return;
    }
    for c in node.children() {
        let start = c.attribute("start").map(num).unwrap_or(0);
        if c.has_tag_name("field") {
            let fname = c.attribute("name").unwrap_or("");
            let ty = c.attribute("type").unwrap_or("");
            let at = base + start;
            if ty == "address" {
                if !fname.ends_with("High") {
                    out.insert(((at / 32) as usize, (at % 32) as u8, repeat));
                }
            } else if let Some(st) = structs.get(ty) {
                collect(*st, at, repeat, structs, out, depth + 1);
            }
        } else if c.has_tag_name("group") {
            let count = c.attribute("count").map(num).unwrap_or(1);
            let size = c.attribute("size").map(num).unwrap_or(0);
            if count == 0 {
                let stride = (size / 32) as usize;
                collect(c, base + start, Some(stride), structs, out, depth + 1);
            } else {
                for i in 0..count.min(64) {
                    collect(c, base + start + i * size, repeat, structs, out, depth + 1);
                }
            }
        }
    }
}

#[test]
fn tables_agree_with_genxml() {
    let Some(dir) = genxml_dir() else {
        eprintln!("SKIPPED: tables_agree_with_genxml needs ../shared/genxml");
        return;
    };
    let mut failures = Vec::new();
    let mut compared = 0usize;
    let mut missing = BTreeSet::new();
    for (gen, g, file) in [
        (Gen::Gen8, 8u8, "gen8.xml"),
        (Gen::Gen9, 9, "gen9.xml"),
        (Gen::Gen11, 11, "gen11.xml"),
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap();
        let structs: std::collections::HashMap<String, roxmltree::Node<'_, '_>> = doc
            .descendants()
            .filter(|n| n.has_tag_name("struct"))
            .filter_map(|n| Some((n.attribute("name")?.to_string(), n)))
            .collect();
        for ins in doc.descendants().filter(|n| n.has_tag_name("instruction")) {
            let name = ins.attribute("name").unwrap_or("?");
            let bias = ins.attribute("bias").map(num).unwrap_or(0);
            let length = ins.attribute("length").map(num);
            let mut dw0 = 0u32;
            let mut len_bits = None;
            let mut addrs: BTreeSet<Addr> = BTreeSet::new();
            collect(ins, 0, None, &structs, &mut addrs, 0);
            for f in ins.children().filter(|n| n.has_tag_name("field")) {
                let start = f.attribute("start").map(num).unwrap_or(0);
                let end = f.attribute("end").map(num).unwrap_or(0);
                let fname = f.attribute("name").unwrap_or("");
                if fname == "DWord Length" {
                    len_bits = Some(end - start + 1);
                } else if end < 32 {
                    if let Some(d) = f.attribute("default") {
                        dw0 |= (num(d) as u32) << start;
                    }
                }
            }
            for engine in engines_of(ins.attribute("engine")) {
                let Some(desc) = lookup(gen, engine, dw0) else {
                    missing.insert(format!("gen{g} {name} ({engine:?})"));
                    continue;
                };
                compared += 1;
                let tag = format!("gen{g} {name} ({engine:?})");
                if desc.name != name {
                    if !known(g, name, "opcode") {
                        failures.push(format!("{tag}: opcode maps to our {}", desc.name));
                    }
                    continue;
                }
                // Length rule.
                let ok_len = match desc.length {
                    LengthRule::Fixed(n) => {
                        len_bits.is_none() && bias == 1 && length == Some(u64::from(n))
                    }
                    LengthRule::Variable { bits, bias: b } => {
                        len_bits == Some(u64::from(bits)) && bias == u64::from(b)
                    }
                };
                if !ok_len && !known(g, name, "length") {
                    failures.push(format!(
                        "{tag}: length rule {:?} vs genxml bias {bias} field {len_bits:?} length {length:?}",
                        desc.length
                    ));
                }
                if let (Some(exact), Some(l)) = (desc.exact_len, length) {
                    if u64::from(exact) != l && !known(g, name, "length") {
                        failures.push(format!("{tag}: exact length {exact} vs genxml {l}"));
                    }
                }
                // Address fields, structures and arrays of structures included.
                let ours: BTreeSet<Addr> = desc
                    .addrs
                    .iter()
                    .map(|a| (usize::from(a.dword), a.lo, a.repeat.map(usize::from)))
                    .collect();
                let opaque = desc.flags.has(gmig_cmdparser::Flags::OPAQUE);
                let lacking: Vec<_> = addrs.difference(&ours).collect();
                if !lacking.is_empty() && !opaque && !known(g, name, "address") {
                    failures.push(format!(
                        "{tag}: genxml address fields {lacking:?} missing (ours {ours:?})"
                    ));
                }
                // Ours may extend past genxml's usual length (e.g. STATE_BASE_ADDRESS fields of
                // later generations are skipped when the command is shorter).
                let extra: Vec<_> = ours
                    .difference(&addrs)
                    .filter(|(dw, _, _)| length.is_none_or(|l| (*dw as u64) < l))
                    .collect();
                if !extra.is_empty() && !known(g, name, "address") {
                    failures.push(format!(
                        "{tag}: our address fields {extra:?} are not genxml addresses"
                    ));
                }
            }
        }
    }
    eprintln!(
        "genxml: compared {compared} (command, engine) pairs; {} genxml commands not in our tables",
        missing.len()
    );
    for m in &missing {
        eprintln!("  not in our tables: {m}");
    }
    assert!(compared > 300, "too few commands compared: {compared}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every listed exception must still be needed (a stale entry hides nothing).
    let used = USED.lock().unwrap();
    let stale: Vec<_> = (0..KNOWN.len())
        .filter(|i| !used.contains(i))
        .map(|i| KNOWN[i].1)
        .collect();
    assert!(stale.is_empty(), "KNOWN entries never needed: {stale:?}");
}
