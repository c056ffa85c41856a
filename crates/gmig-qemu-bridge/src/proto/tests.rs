//! Layouts against the specification's field tables, and decoders fed arbitrary bytes.

use super::*;

/// Each layout, byte by byte, against the field tables (offset, size) of the specification.
#[test]
fn layouts_match_the_specification_field_tables() {
    let h = Header {
        msg_id: 0x0102,
        command: 17,
        size: 0x2a,
        flags: FLAG_REPLY | FLAG_ERROR,
        error: 22,
    };
    // Message ID @0 (2), Command @2 (2), Message size @4 (4), Flags @8 (4), Error @12 (4).
    assert_eq!(
        h.to_bytes(),
        [2, 1, 17, 0, 0x2a, 0, 0, 0, 0x21, 0, 0, 0, 22, 0, 0, 0]
    );
    assert_eq!(Header::parse(&h.to_bytes(), 64).unwrap(), h);
    // DMA_MAP: argsz @0 (4), flags @4 (4), offset @8 (8), address @16 (8), size @24 (8).
    let m = DmaMap {
        argsz: 32,
        flags: 3,
        offset: 0x1000,
        address: 0x8000_0000,
        size: 0x4000,
    };
    let b = m.to_bytes();
    assert_eq!(b.len(), DmaMap::LEN);
    assert_eq!(&b[0..4], &32u32.to_le_bytes());
    assert_eq!(&b[4..8], &3u32.to_le_bytes());
    assert_eq!(&b[8..16], &0x1000u64.to_le_bytes());
    assert_eq!(&b[16..24], &0x8000_0000u64.to_le_bytes());
    assert_eq!(&b[24..32], &0x4000u64.to_le_bytes());
    assert_eq!(DmaMap::parse(&b).unwrap(), m);
    // DMA_UNMAP: argsz @0, flags @4, address @8 (8), size @16 (8).
    let u = DmaUnmap {
        argsz: 24,
        flags: 0,
        address: 0x8000_0000,
        size: 0x4000,
    };
    let b = u.to_bytes();
    assert_eq!(&b[8..16], &0x8000_0000u64.to_le_bytes());
    assert_eq!(DmaUnmap::parse(&b).unwrap(), u);
    // REGION_READ/WRITE: offset @0 (8), region @8 (4), count @12 (4), data @16.
    let a = RegionAccess {
        offset: 0x78000,
        region: 0,
        count: 4,
    };
    let b = a.to_bytes(&[1, 2, 3, 4]);
    assert_eq!(&b[0..8], &0x78000u64.to_le_bytes());
    assert_eq!(&b[12..16], &4u32.to_le_bytes());
    assert_eq!(&b[16..], &[1, 2, 3, 4]);
    // DEVICE_FEATURE: argsz @0 (4), flags @4 (4), data @8; MIG_DEVICE_STATE data:
    // device_state @0 (4), data_fd @4 (4).
    let mut state = Vec::new();
    state.put32(6); // PRE_COPY
    state.put32(u32::MAX); // data_fd -1: vfio-user moves data over the socket
    let b = Feature::to_bytes(FEATURE_SET | FEATURE_MIG_DEVICE_STATE, &state);
    assert_eq!(&b[0..4], &16u32.to_le_bytes());
    assert_eq!(&b[4..8], &0x2_0002u32.to_le_bytes());
    assert_eq!(&b[8..12], &6u32.to_le_bytes());
    let (f, data) = Feature::parse(&b).unwrap();
    assert_eq!((f.index(), data.len()), (FEATURE_MIG_DEVICE_STATE, 8));
    // MIG_DATA_READ/WRITE: argsz @0 (4), size @4 (4), data @8.
    let b = MigData::to_bytes(12, 4, &[9, 9, 9, 9]);
    assert_eq!(&b[0..8], &[12, 0, 0, 0, 4, 0, 0, 0]);
    let (md, rest) = MigData::parse(&b).unwrap();
    assert_eq!((md.argsz, md.size, rest), (12, 4, &[9u8, 9, 9, 9][..]));
    // DMA_READ/WRITE: address @0 (8), count @8 (8), data @16.
    let b = DmaAccess {
        address: 0x1_2345_6000,
        count: 3,
    }
    .to_bytes(&[7, 8, 9]);
    assert_eq!(&b[0..8], &0x1_2345_6000u64.to_le_bytes());
    assert_eq!(&b[8..16], &3u64.to_le_bytes());
    assert_eq!(&b[16..], &[7, 8, 9]);
    // GET_REGION_INFO (struct vfio_region_info): argsz @0, flags @4, index @8,
    // cap_offset @12, size @16 (8), offset @24 (8); the sparse-mmap capability after it:
    // id @0 (2) = 1, version @2 (2) = 1, next @4 (4), nr_areas @8, reserved @12, areas
    // {offset, size} (16 each) @16.
    let caps = sparse_mmap_cap(&[SparseArea {
        offset: 0x1000,
        size: 0x2000,
    }]);
    let ri = RegionInfo {
        argsz: 64,
        flags: 15,
        index: 2,
        cap_offset: 32,
        size: 0x4000,
        offset: 0x10_0000,
    };
    let b = ri.to_bytes(&caps);
    assert_eq!(b.len(), 64);
    assert_eq!(&b[8..12], &2u32.to_le_bytes());
    assert_eq!(&b[12..16], &32u32.to_le_bytes());
    assert_eq!(&b[16..24], &0x4000u64.to_le_bytes());
    assert_eq!(&b[24..32], &0x10_0000u64.to_le_bytes());
    assert_eq!(&b[32..40], &[1, 0, 1, 0, 0, 0, 0, 0]);
    assert_eq!(&b[40..44], &1u32.to_le_bytes());
    assert_eq!(&b[48..56], &0x1000u64.to_le_bytes());
    assert_eq!(&b[56..64], &0x2000u64.to_le_bytes());
    assert_eq!(
        parse_sparse_mmap(&b, 32).unwrap().unwrap(),
        [SparseArea {
            offset: 0x1000,
            size: 0x2000
        }]
    );
    // GET_REGION_IO_FDS: argsz @0, flags @4, index @8, count @12; each sub-region:
    // offset @0 (8), size @8 (8), fd_index @16, type @20, flags @24, padding @28,
    // datamatch @32 (8).
    let e = IoFdEntry {
        offset: 0x200,
        size: 4,
        fd_index: 1,
        kind: IO_FD_IOEVENTFD,
        flags: IO_FD_DATAMATCH,
        padding: 0,
        datamatch: 0xdead,
    };
    let b = IoFdsHead {
        argsz: 56,
        flags: 0,
        index: 0,
        count: 1,
    }
    .to_bytes(&[e]);
    assert_eq!(b.len(), 56);
    assert_eq!(&b[12..16], &1u32.to_le_bytes());
    assert_eq!(&b[16..24], &0x200u64.to_le_bytes());
    assert_eq!(&b[32..36], &1u32.to_le_bytes());
    assert_eq!(&b[40..44], &1u32.to_le_bytes());
    assert_eq!(&b[48..56], &0xdeadu64.to_le_bytes());
    assert_eq!(IoFdEntry::parse_all(&b[16..], 1).unwrap(), [e]);
    // REGION_WRITE_MULTI: wr_cnt @0 (8), then entries: offset @0 (8), region @8, count @12,
    // data @16 (8).
    let w = WriteMultiEntry {
        offset: 0x40,
        region: 0,
        count: 4,
        data: 0x1122_3344,
    };
    let b = WriteMultiEntry::request(&[w]);
    assert_eq!(b.len(), 32);
    assert_eq!(&b[0..8], &1u64.to_le_bytes());
    assert_eq!(&b[8..16], &0x40u64.to_le_bytes());
    assert_eq!(&b[20..24], &4u32.to_le_bytes());
    assert_eq!(&b[24..32], &0x1122_3344u64.to_le_bytes());
    assert_eq!(WriteMultiEntry::parse_request(&b).unwrap(), [w]);
    // GFX_PLANE (gmig's feature 0x8001): struct vfio_device_gfx_plane_info, argsz @0, flags @4,
    // drm_plane_type @8, drm_format @12, drm_format_mod @16 (8), width @24, height @28,
    // stride @32, size @36, x_pos @40, y_pos @44, x_hot @48, y_hot @52, region_index @56,
    // reserved @60; DRM_FORMAT_XRGB8888 is fourcc "XR24".
    let g = GfxPlane {
        argsz: 64,
        flags: GFX_PLANE_REGION,
        drm_plane_type: 1,
        drm_format: DRM_FORMAT_XRGB8888,
        drm_format_mod: 0x0102_0304_0506_0708,
        width: 1024,
        height: 768,
        stride: 4096,
        size: 4096 * 768,
        x_pos: 1,
        y_pos: 2,
        x_hot: 3,
        y_hot: 4,
        region_index: 9,
        reserved: 0,
    };
    let b = g.to_bytes();
    assert_eq!(b.len(), 64);
    assert_eq!(&b[4..8], &4u32.to_le_bytes());
    assert_eq!(&b[12..16], b"XR24");
    assert_eq!(&b[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(&b[24..28], &1024u32.to_le_bytes());
    assert_eq!(&b[32..36], &4096u32.to_le_bytes());
    assert_eq!(&b[52..56], &4u32.to_le_bytes());
    assert_eq!(&b[56..60], &9u32.to_le_bytes());
    assert_eq!(GfxPlane::parse(&b).unwrap(), (g, &[][..]));
    assert_eq!(FEATURE_GFX_PLANE, 0x8001);
}

proptest::proptest! {
    #[test]
    fn no_payload_panics_any_decoder(p in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
        let _ = DmaMap::parse(&p);
        let _ = DmaUnmap::parse(&p);
        let _ = RegionAccess::parse(&p);
        let _ = Feature::parse(&p);
        let _ = GfxPlane::parse(&p);
        let _ = MigData::parse(&p);
        let _ = RegionInfo::parse(&p);
        let _ = DmaAccess::parse(&p);
        let _ = IoFdsHead::parse(&p);
        let _ = WriteMultiEntry::parse_request(&p);
        for cap_offset in [0u32, 32, 40, 48] {
            let _ = parse_sparse_mmap(&p, cap_offset);
        }
        let _ = IoFdEntry::parse_all(&p, p.first().copied().unwrap_or(0).into());
        if let Ok(b) = <[u8; HEADER_LEN]>::try_from(p.get(..HEADER_LEN).unwrap_or(&[])) {
            let _ = Header::parse(&b, 1 << 20);
        }
    }
}
