//! The host's slot registry of `gmig serve --slots DIR`: every server of one host records the
//! graphics-memory slices it took in DIR, so that a server started later (a second domain, an
//! incoming migration) takes a slot no running vGPU overlaps.
//!
//! Each server keeps `DIR/PID.claim` (its socket, type, slot and slices, JSON) open with an
//! exclusive `flock` for as long as it runs; a claim whose lock can be taken belongs to a server
//! that is gone (killed, crashed), and is removed. `DIR/.lock` serialises the choosing: a server
//! reads the live claims, picks its slot and writes its own claim under that lock, so that servers
//! started at once (two migrations arriving together) never pick the same slot.
//!
//! Slot `n` of a type is where the `n + 1`-th vGPU of that type lands on an empty host (first
//! fit), as without the registry; the slot asked for is a preference: when a live claim overlaps
//! it, the next slot up that overlaps nothing is taken, then the lowest.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use gmig_vgpu::gm::{slot_count, slot_slices, HostConfig, VgpuSlices, VgpuType};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// What a claim file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The server's process.
    pub pid: u32,
    /// Its vfio-user socket.
    pub socket: String,
    /// Its vGPU type (`64+384`).
    pub vgpu_type: String,
    /// The slot it took.
    pub slot: u32,
    /// Its slices.
    pub slices: VgpuSlices,
}

impl Record {
    /// `SOCKET (pid P, TYPE, slot N)`: who holds the slot, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} (pid {}, {}, slot {})",
            self.socket, self.pid, self.vgpu_type, self.slot
        )
    }
}

/// A slot this server holds until it is dropped (or the process ends).
#[derive(Debug)]
pub struct Claim {
    /// The slot taken.
    pub slot: u32,
    /// Its slices.
    pub slices: VgpuSlices,
    /// The claims that overlapped the slot asked for, when another was taken.
    pub displaced_by: Vec<Record>,
    path: PathBuf,
    _file: Flock<File>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The live claims in `dir`, removing those whose server is gone.
pub fn live_claims(dir: &Path) -> anyhow::Result<Vec<Record>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for entry in entries {
        let path = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        if path.extension().and_then(|e| e.to_str()) != Some("claim") {
            continue;
        }
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        };
        let mut text = String::new();
        file.read_to_string(&mut text)
            .with_context(|| format!("reading {}", path.display()))?;
        match Flock::lock(file, FlockArg::LockSharedNonblock) {
            // Nobody holds it: its server is gone.
            Ok(_stale) => {
                let _ = std::fs::remove_file(&path);
            }
            Err((_, Errno::EWOULDBLOCK)) => {
                let rec: Record = serde_json::from_str(&text).with_context(|| {
                    format!(
                        "{} (a running server's slot claim) is not one",
                        path.display()
                    )
                })?;
                out.push(rec);
            }
            Err((_, e)) => return Err(anyhow!("locking {}: {e}", path.display())),
        }
    }
    out.sort_by_key(|r| r.pid);
    Ok(out)
}

/// The slot for a `ty` vGPU that wants `wanted` beside `others`: `wanted` when none of them
/// overlaps it, else the next one up that nothing overlaps, else the lowest such.
pub fn choose(
    host: HostConfig,
    ty: VgpuType,
    wanted: u32,
    others: &[Record],
) -> Option<(u32, VgpuSlices)> {
    let count = slot_count(host, ty);
    (wanted..count)
        .chain(0..wanted.min(count))
        .filter_map(|n| slot_slices(host, ty, n).ok().map(|s| (n, s)))
        .find(|(_, s)| others.iter().all(|r| !r.slices.overlaps(s)))
}

/// Takes a slot for a `ty` vGPU serving `socket`: `wanted` when no live claim in `dir` overlaps
/// it, else the next free one up, else the lowest free one.
pub fn claim(
    dir: &Path,
    host: HostConfig,
    ty: VgpuType,
    wanted: u32,
    socket: &Path,
) -> anyhow::Result<Claim> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock_path = dir.join(".lock");
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow!("locking {}: {e}", lock_path.display()))?;
    let others = live_claims(dir)?;
    let chosen = choose(host, ty, wanted, &others);
    let name = gmig_vgpu::migratable::type_id(ty);
    let type_name = format!("{}+{}", name.aperture_mib, name.hidden_mib);
    let Some((slot, slices)) = chosen else {
        let held: Vec<String> = others.iter().map(Record::describe).collect();
        return Err(anyhow!(
            "no free slot for a {type_name} vGPU in {}: each of this host's {} slots of \
             that type overlaps a running vGPU: {}",
            dir.display(),
            slot_count(host, ty),
            if held.is_empty() {
                "none".to_string()
            } else {
                held.join(", ")
            }
        ));
    };
    let displaced_by = match slot_slices(host, ty, wanted) {
        Ok(w) if slot != wanted => others
            .into_iter()
            .filter(|r| r.slices.overlaps(&w))
            .collect(),
        _ => Vec::new(),
    };
    let record = Record {
        pid: std::process::id(),
        socket: socket.display().to_string(),
        vgpu_type: type_name,
        slot,
        slices,
    };
    let path = dir.join(format!("{}.claim", record.pid));
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let mut file = Flock::lock(file, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| anyhow!("locking {}: {e}", path.display()))?;
    let written = serde_json::to_string(&record)
        .map_err(anyhow::Error::from)
        .and_then(|text| Ok(file.write_all(text.as_bytes())?));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&path);
        return Err(e.context(format!("writing {}", path.display())));
    }
    Ok(Claim {
        slot,
        slices,
        displaced_by,
        path,
        _file: file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ty() -> VgpuType {
        gmig_vgpu::migratable::parse_vgpu_type("64+384").unwrap()
    }

    fn record(pid: u32, slot: u32) -> Record {
        Record {
            pid,
            socket: format!("/{pid}.sock"),
            vgpu_type: "64+384".into(),
            slot,
            slices: slot_slices(HostConfig::default(), ty(), slot).unwrap(),
        }
    }

    #[test]
    fn the_slot_asked_for_when_free_then_the_next_one_up_then_the_lowest() {
        let host = HostConfig::default();
        let at = |wanted, others: &[Record]| choose(host, ty(), wanted, others).map(|c| c.0);
        assert_eq!(at(1, &[]), Some(1));
        assert_eq!(at(1, &[record(10, 1)]), Some(2));
        assert_eq!(at(1, &[record(10, 1), record(11, 2)]), Some(3));
        let upper: Vec<Record> = (1..7).map(|n| record(10 + n, n)).collect();
        assert_eq!(at(1, &upper), Some(0), "wraps to the lowest free slot");
        let all: Vec<Record> = (0..7).map(|n| record(10 + n, n)).collect();
        assert_eq!(at(3, &all), None, "a full host has no slot");
        assert_eq!(
            at(9, &[]),
            Some(0),
            "a slot past the host's last is a preference too"
        );
    }

    #[test]
    fn a_vgpu_of_another_type_blocks_every_slot_its_slices_overlap() {
        let host = HostConfig::default();
        let big = gmig_vgpu::migratable::parse_vgpu_type("256+1024").unwrap();
        let held = Record {
            pid: 9,
            socket: "/big.sock".into(),
            vgpu_type: "256+1024".into(),
            slot: 0,
            slices: slot_slices(host, big, 0).unwrap(),
        };
        // Its 256 MiB aperture covers the first four 64 MiB apertures: a 64+384 vGPU that wants
        // slot 0 gets the first slot whose slices it does not touch, and that slot is free.
        let (slot, got) = choose(host, ty(), 0, std::slice::from_ref(&held)).unwrap();
        assert!(!held.slices.overlaps(&got));
        assert!((0..slot).all(|n| held.slices.overlaps(&slot_slices(host, ty(), n).unwrap())));
        assert_eq!(slot, 4, "256 MiB of aperture are four 64 MiB slots");
    }

    #[test]
    fn a_claim_is_recorded_while_held_and_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostConfig::default();
        let a = claim(dir.path(), host, ty(), 1, Path::new("/x.sock")).unwrap();
        assert_eq!(a.slot, 1);
        assert!(a.displaced_by.is_empty());
        assert_eq!(Ok(a.slices), slot_slices(host, ty(), 1));
        let live = live_claims(dir.path()).unwrap();
        assert_eq!(live.len(), 1);
        assert_eq!((live[0].slot, live[0].pid), (1, std::process::id()));
        drop(a);
        assert!(
            live_claims(dir.path()).unwrap().is_empty(),
            "removed on drop"
        );
    }

    #[test]
    fn a_dead_servers_claim_is_cleared_and_frees_its_slot() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostConfig::default();
        // A claim file nobody holds (its server died): cleared, and its slot is free again.
        let stale = record(1, 1);
        std::fs::write(
            dir.path().join("1.claim"),
            serde_json::to_string(&stale).unwrap(),
        )
        .unwrap();
        let c = claim(dir.path(), host, ty(), 1, Path::new("/a.sock")).unwrap();
        assert_eq!(c.slot, 1, "a dead server's claim does not hold its slot");
        assert!(!dir.path().join("1.claim").exists());
        assert!(stale.slices.overlaps(&slot_slices(host, ty(), 1).unwrap()));
        assert!(!stale.slices.overlaps(&slot_slices(host, ty(), 2).unwrap()));
    }

    #[test]
    fn a_host_has_seven_slots_of_64_384_and_none_beyond() {
        let host = HostConfig::default();
        assert_eq!(slot_count(host, ty()), 7);
        assert!(slot_slices(host, ty(), 6).is_ok());
        assert!(slot_slices(host, ty(), 7).is_err());
    }
}
