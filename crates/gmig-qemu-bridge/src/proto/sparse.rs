//! The sparse-mmap capability of a region-info reply: encoding it and finding it in a capability
//! chain, with every offset a peer supplies checked.

use super::codec::{ProtoError, Put, Reader};
use super::messages::RegionInfo;

/// `struct vfio_region_sparse_mmap_area`: the part of a region a client may `mmap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparseArea {
    /// Offset in the region.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

/// `VFIO_REGION_INFO_CAP_SPARSE_MMAP`'s capability id and the version gmig writes.
const CAP_SPARSE_MMAP: u16 = vfio_bindings::bindings::vfio::VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16;
/// Most capabilities followed in one chain (a loop guard).
const MAX_CAPS: usize = 16;
/// Most sparse areas accepted in one capability.
pub const MAX_SPARSE_AREAS: usize = 64;

/// Encodes a `VFIO_REGION_INFO_CAP_SPARSE_MMAP` capability (header: id, version 1, next 0; then
/// `nr_areas`, reserved, and the areas), to be placed right after the 32-byte region info.
pub fn sparse_mmap_cap(areas: &[SparseArea]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + 16 * areas.len());
    v.put16(CAP_SPARSE_MMAP);
    v.put16(1);
    v.put32(0);
    v.put32(areas.len() as u32);
    v.put32(0);
    for a in areas {
        v.put64(a.offset);
        v.put64(a.size);
    }
    v
}

/// Finds the sparse-mmap areas in a region-info reply (`reply` starts at the 32-byte fixed part):
/// follows the capability chain from `cap_offset`, each offset relative to the start of the
/// fixed part, refusing offsets that point backwards or outside the reply and chains longer than
/// a few capabilities. Unknown capabilities are skipped. `Ok(None)` when the chain has no sparse
/// capability.
pub fn parse_sparse_mmap(
    reply: &[u8],
    cap_offset: u32,
) -> Result<Option<Vec<SparseArea>>, ProtoError> {
    let mut at = cap_offset as usize;
    let mut seen = 0;
    while at != 0 {
        seen += 1;
        if seen > MAX_CAPS || at < RegionInfo::LEN {
            return Err(ProtoError::LengthMismatch {
                what: "capability offset",
                declared: at as u64,
                present: reply.len() as u64,
            });
        }
        let mut r = Reader::new(reply.get(at..).ok_or(ProtoError::Short {
            offset: at,
            need: 8,
            have: reply.len(),
        })?);
        let (id, _version, next) = (r.u16()?, r.u16()?, r.u32()?);
        if id == CAP_SPARSE_MMAP {
            let (n, _reserved) = (r.u32()? as usize, r.u32()?);
            if n > MAX_SPARSE_AREAS {
                return Err(ProtoError::LengthMismatch {
                    what: "sparse mmap nr_areas",
                    declared: n as u64,
                    present: MAX_SPARSE_AREAS as u64,
                });
            }
            let areas = (0..n)
                .map(|_| {
                    Ok(SparseArea {
                        offset: r.u64()?,
                        size: r.u64()?,
                    })
                })
                .collect::<Result<_, ProtoError>>()?;
            return Ok(Some(areas));
        }
        let next = next as usize;
        if next != 0 && next <= at {
            return Err(ProtoError::LengthMismatch {
                what: "capability next (must move forward)",
                declared: next as u64,
                present: at as u64,
            });
        }
        at = next;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_chains_that_loop_point_back_or_overrun_are_refused() {
        let ri = RegionInfo {
            argsz: 64,
            flags: 15,
            index: 0,
            cap_offset: 32,
            size: 0,
            offset: 0,
        };
        // An unknown capability whose `next` points at itself.
        let mut cap = Vec::new();
        cap.put16(99);
        cap.put16(1);
        cap.put32(32);
        let b = ri.to_bytes(&cap);
        assert!(parse_sparse_mmap(&b, 32).is_err());
        // An offset inside the fixed part, one past the end, a count past the areas present.
        assert!(parse_sparse_mmap(&b, 8).is_err());
        assert!(parse_sparse_mmap(&b, 1000).is_err());
        let mut caps = sparse_mmap_cap(&[SparseArea { offset: 0, size: 1 }]);
        caps[8] = 2; // nr_areas 2, one present
        assert!(parse_sparse_mmap(&ri.to_bytes(&caps), 32).is_err());
        // An unknown capability first, then the sparse one: found.
        let mut cap = Vec::new();
        cap.put16(99);
        cap.put16(1);
        cap.put32(40);
        cap.extend_from_slice(&sparse_mmap_cap(&[SparseArea { offset: 0, size: 1 }]));
        let found = parse_sparse_mmap(&ri.to_bytes(&cap), 32).unwrap().unwrap();
        assert_eq!(found.len(), 1);
    }
}
