//! Graphics memory: GVT-g vGPU types, guest frames, and the per-host partition manager.
//!
//! A GVT-g host splits its global graphics memory (the GGTT address space) into a CPU-visible
//! *aperture* part at the bottom and a *hidden* part above it. Each vGPU gets one contiguous slice
//! of each ("ballooning": the guest is told where its slices are and keeps out of the rest). The
//! [`PartitionManager`] places several vGPUs' slices on one host; a destination host generally
//! places a migrating vGPU's slices at other offsets than the source did, and the two slices move
//! independently.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use gmig_cmdparser::{Gen, GgttOffset, Slice, SliceMove, VgpuSlices};

/// Size of one GTT page (one GGTT entry maps one such page).
pub const PAGE_SIZE: u64 = 4096;
/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// Errors of the graphics-memory module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GmError {
    /// No free range of the requested size is left in one part of the host's graphics memory.
    #[error("no room for a {size:#x}-byte {part} slice on this host")]
    NoRoom {
        /// "aperture" or "hidden".
        part: &'static str,
        /// Requested size in bytes.
        size: u64,
    },
    /// The host configuration is inconsistent.
    #[error("bad host configuration: {0}")]
    BadHostConfig(&'static str),
    /// No vGPU with this id is placed on the host.
    #[error("vGPU {0} is not placed on this host")]
    UnknownVgpu(u32),
}

/// Result type of this module.
pub type Result<T> = std::result::Result<T, GmError>;

/// Guest frame numbers: one type across gmig, defined by `gmig-dirty` (which hashes them).
pub use gmig_dirty::Gfn;

/// The four GVT-g vGPU types (named after the SKL+ types; the number is how many fit a host).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum VgpuType {
    /// 64 MiB aperture + 384 MiB hidden.
    V5_8,
    /// 128 MiB aperture + 512 MiB hidden.
    V5_4,
    /// 256 MiB aperture + 1024 MiB hidden.
    V5_2,
    /// 512 MiB aperture + 2048 MiB hidden.
    V5_1,
}

impl VgpuType {
    /// Every type, smallest first.
    pub const ALL: [VgpuType; 4] = [
        VgpuType::V5_8,
        VgpuType::V5_4,
        VgpuType::V5_2,
        VgpuType::V5_1,
    ];

    /// The resolution of the type's virtual monitor: 1024x768 for the smallest type, 1920x1200
    /// for the others (GVT-g's `GVT_EDID_1024_768` and `GVT_EDID_1920_1200`).
    pub fn resolution(self) -> crate::display::edid::Resolution {
        match self {
            VgpuType::V5_8 => crate::display::edid::Resolution::XGA,
            _ => crate::display::edid::Resolution::WUXGA,
        }
    }

    /// Aperture (low, CPU-visible) graphics memory in bytes.
    pub fn aperture_size(self) -> u64 {
        match self {
            VgpuType::V5_8 => 64 * MIB,
            VgpuType::V5_4 => 128 * MIB,
            VgpuType::V5_2 => 256 * MIB,
            VgpuType::V5_1 => 512 * MIB,
        }
    }

    /// Hidden (high) graphics memory in bytes.
    pub fn hidden_size(self) -> u64 {
        match self {
            VgpuType::V5_8 => 384 * MIB,
            VgpuType::V5_4 => 512 * MIB,
            VgpuType::V5_2 => 1024 * MIB,
            VgpuType::V5_1 => 2048 * MIB,
        }
    }

    /// Total graphics memory (aperture + hidden) in bytes.
    pub fn total_size(self) -> u64 {
        self.aperture_size() + self.hidden_size()
    }

    /// The GVT-g type name.
    pub fn name(self) -> &'static str {
        match self {
            VgpuType::V5_8 => "GVTg_V5_8",
            VgpuType::V5_4 => "GVTg_V5_4",
            VgpuType::V5_2 => "GVTg_V5_2",
            VgpuType::V5_1 => "GVTg_V5_1",
        }
    }
}

/// Slices of the given sizes at the given bases.
pub fn slices_at(
    aperture_base: u64,
    aperture_size: u64,
    hidden_base: u64,
    hidden_size: u64,
) -> VgpuSlices {
    VgpuSlices {
        aperture: Slice {
            base: GgttOffset(aperture_base),
            size: aperture_size,
        },
        hidden: Slice {
            base: GgttOffset(hidden_base),
            size: hidden_size,
        },
    }
}

/// Where a vGPU of type `ty` in host slot `slot` lands: after `slot` others of its type on an
/// empty `host`, first fit (`gmig serve --slot`, `VgpuSpec::for_guest`). `NoRoom` when the host
/// has no such slot.
pub fn slot_slices(host: HostConfig, ty: VgpuType, slot: u32) -> Result<VgpuSlices> {
    let mut pm = PartitionManager::new(host)?;
    for _ in 0..slot {
        pm.place(ty)?;
    }
    pm.place(ty).map(|(_, s)| s)
}

/// How many slots of type `ty` an empty `host` has.
pub fn slot_count(host: HostConfig, ty: VgpuType) -> u32 {
    let Ok(mut pm) = PartitionManager::new(host) else {
        return 0;
    };
    let mut n = 0;
    while pm.place(ty).is_ok() {
        n += 1;
    }
    n
}

/// The shape of one host's global graphics memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostConfig {
    /// Size of the aperture part, which starts at GGTT offset 0.
    pub aperture_size: u64,
    /// Size of the whole GGTT address space (aperture + hidden).
    pub total_size: u64,
    /// Aperture bytes at the bottom kept by the host driver itself.
    pub host_aperture: u64,
    /// Hidden bytes at the bottom of the hidden part kept by the host driver itself.
    pub host_hidden: u64,
}

impl Default for HostConfig {
    /// A 4 GiB GGTT with a 1 GiB aperture, the host keeping 64 MiB of each part.
    fn default() -> Self {
        HostConfig {
            aperture_size: 1024 * MIB,
            total_size: 4096 * MIB,
            host_aperture: 64 * MIB,
            host_hidden: 64 * MIB,
        }
    }
}

/// Places vGPUs' aperture and hidden slices on one host (first fit, page aligned).
#[derive(Clone, Debug)]
pub struct PartitionManager {
    config: HostConfig,
    placed: BTreeMap<u32, (VgpuType, VgpuSlices)>,
    next_id: u32,
}

impl PartitionManager {
    /// A host with nothing placed yet.
    pub fn new(config: HostConfig) -> Result<Self> {
        if config.aperture_size > config.total_size
            || config.host_aperture > config.aperture_size
            || config.host_hidden > config.total_size - config.aperture_size
            || !config.total_size.is_multiple_of(PAGE_SIZE)
            || !config.aperture_size.is_multiple_of(PAGE_SIZE)
        {
            return Err(GmError::BadHostConfig(
                "sizes do not nest or are not page aligned",
            ));
        }
        Ok(PartitionManager {
            config,
            placed: BTreeMap::new(),
            next_id: 1,
        })
    }

    /// The host's configuration.
    pub fn config(&self) -> HostConfig {
        self.config
    }

    /// Places a vGPU of type `ty` at the first free offsets.
    pub fn place(&mut self, ty: VgpuType) -> Result<(u32, VgpuSlices)> {
        self.place_avoiding(ty, None)
    }

    /// Places a vGPU of type `ty`, choosing for each slice a base other than `avoid`'s slice base
    /// when the host has room for that (a migration destination uses this to make sure the
    /// slices really move).
    pub fn place_avoiding(
        &mut self,
        ty: VgpuType,
        avoid: Option<&VgpuSlices>,
    ) -> Result<(u32, VgpuSlices)> {
        let ap_range = (self.config.host_aperture, self.config.aperture_size);
        let hid_range = (
            self.config.aperture_size + self.config.host_hidden,
            self.config.total_size,
        );
        let ap_used: Vec<Slice> = self.placed.values().map(|(_, s)| s.aperture).collect();
        let hid_used: Vec<Slice> = self.placed.values().map(|(_, s)| s.hidden).collect();
        let ap = fit(
            ap_range,
            &ap_used,
            ty.aperture_size(),
            avoid.map(|a| a.aperture.base.0),
        )
        .ok_or(GmError::NoRoom {
            part: "aperture",
            size: ty.aperture_size(),
        })?;
        let hid = fit(
            hid_range,
            &hid_used,
            ty.hidden_size(),
            avoid.map(|a| a.hidden.base.0),
        )
        .ok_or(GmError::NoRoom {
            part: "hidden",
            size: ty.hidden_size(),
        })?;
        let slices = slices_at(ap, ty.aperture_size(), hid, ty.hidden_size());
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.placed.insert(id, (ty, slices));
        Ok((id, slices))
    }

    /// Frees a vGPU's slices.
    pub fn release(&mut self, id: u32) -> Result<()> {
        self.placed
            .remove(&id)
            .map(|_| ())
            .ok_or(GmError::UnknownVgpu(id))
    }

    /// The slices of every placed vGPU.
    pub fn placed(&self) -> impl Iterator<Item = (u32, VgpuType, VgpuSlices)> + '_ {
        self.placed.iter().map(|(id, (ty, s))| (*id, *ty, *s))
    }
}

/// First page-aligned base in `range` where `size` bytes overlap nothing in `used`; with `avoid`,
/// a base other than `avoid` is preferred (gap starts first, then gap ends).
fn fit(range: (u64, u64), used: &[Slice], size: u64, avoid: Option<u64>) -> Option<u64> {
    let mut taken: Vec<(u64, u64)> = used
        .iter()
        .map(|s| (s.base.0, s.base.0.saturating_add(s.size)))
        .collect();
    taken.sort_unstable();
    let mut gaps = Vec::new();
    let mut cursor = range.0;
    for (start, end) in taken {
        if start > cursor {
            gaps.push((cursor, start.min(range.1)));
        }
        cursor = cursor.max(end);
    }
    if cursor < range.1 {
        gaps.push((cursor, range.1));
    }
    let mut candidates = Vec::new();
    for &(start, end) in &gaps {
        if end.saturating_sub(start) >= size {
            candidates.push(start);
            let last = (end - size) / PAGE_SIZE * PAGE_SIZE;
            if last >= start {
                candidates.push(last);
            }
        }
    }
    candidates
        .iter()
        .copied()
        .find(|c| Some(*c) != avoid)
        .or_else(|| candidates.first().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_have_the_gvt_sizes() {
        let sizes: Vec<(u64, u64)> = VgpuType::ALL
            .iter()
            .map(|t| (t.aperture_size() / MIB, t.hidden_size() / MIB))
            .collect();
        assert_eq!(sizes, vec![(64, 384), (128, 512), (256, 1024), (512, 2048)]);
    }

    #[test]
    fn placements_do_not_overlap_and_stay_in_their_parts() {
        let cfg = HostConfig::default();
        let mut pm = PartitionManager::new(cfg).unwrap();
        let mut all = Vec::new();
        for ty in [
            VgpuType::V5_8,
            VgpuType::V5_4,
            VgpuType::V5_8,
            VgpuType::V5_2,
        ] {
            let (_, s) = pm.place(ty).unwrap();
            assert!(s.aperture.base.0 >= cfg.host_aperture);
            assert!(s.aperture.base.0 + s.aperture.size <= cfg.aperture_size);
            assert!(s.hidden.base.0 >= cfg.aperture_size + cfg.host_hidden);
            assert!(s.hidden.base.0 + s.hidden.size <= cfg.total_size);
            all.push(s);
        }
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert!(!a.aperture.overlaps(&b.aperture));
                assert!(!a.hidden.overlaps(&b.hidden));
            }
        }
    }

    #[test]
    fn full_host_refuses_and_release_frees() {
        let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
        let (id, _) = pm.place(VgpuType::V5_1).unwrap();
        assert!(matches!(
            pm.place(VgpuType::V5_1),
            Err(GmError::NoRoom { .. })
        ));
        pm.release(id).unwrap();
        assert!(pm.place(VgpuType::V5_1).is_ok());
        assert_eq!(pm.release(999), Err(GmError::UnknownVgpu(999)));
    }

    #[test]
    fn avoiding_moves_both_slices() {
        let mut src = PartitionManager::new(HostConfig::default()).unwrap();
        let (_, s) = src.place(VgpuType::V5_8).unwrap();
        let mut dst = PartitionManager::new(HostConfig::default()).unwrap();
        let (_, d) = dst.place_avoiding(VgpuType::V5_8, Some(&s)).unwrap();
        assert_ne!(s.aperture.base, d.aperture.base);
        assert_ne!(s.hidden.base, d.hidden.base);
        assert_eq!(s.aperture.size, d.aperture.size);
    }

    #[test]
    fn bad_config_is_refused() {
        let cfg = HostConfig {
            aperture_size: 8 * 1024 * MIB,
            ..HostConfig::default()
        };
        assert!(PartitionManager::new(cfg).is_err());
    }
}
