//! The display for a VMM (gmig's vfio-user GFX_PLANE feature, QEMU patch 0006): a vGPU with a
//! monitor offers the display region (index 9, read-only, mappable by its memfd) and answers
//! GFX_PLANE queries with pipe A's primary plane, written into the region as XRGB8888 rows
//! before the reply; what it refuses; and a vGPU without a monitor has neither.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::thread::JoinHandle;

use gmig_cmdparser::VgpuSlices;
use gmig_qemu_bridge::client::{Client, ClientError};
use gmig_qemu_bridge::proto::{
    Command, Feature, GfxPlane, DRM_FORMAT_XRGB8888, FEATURE_GET, FEATURE_GFX_PLANE, FEATURE_PROBE,
    GFX_PLANE_DMABUF, GFX_PLANE_PROBE, GFX_PLANE_REGION,
};
use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec};
use gmig_vgpu::gm::VgpuType;
use gmig_vgpu::mmio;
use gmig_vgpu::regs::display::{PLANE_CTL_A, PLANE_SIZE_A, PLANE_STRIDE_A, PLANE_SURF_A};

mod common;

const TY: VgpuType = VgpuType::V5_8;

fn spawn(
    slices: VgpuSlices,
    monitor: bool,
) -> (PathBuf, JoinHandle<VgpuBackend>, tempfile::TempDir) {
    let spec = VgpuSpec {
        monitor,
        ..common::spec(TY, slices, true)
    };
    common::serve(spec, 1)
}

fn errno<T: std::fmt::Debug>(r: Result<T, ClientError>) -> i32 {
    match r {
        Err(ClientError::Refused { errno, .. }) => errno,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A GFX_PLANE GET with `flags`; the reply's plane.
fn query(c: &mut Client, flags: u32) -> Result<GfxPlane, ClientError> {
    let req = GfxPlane::new(flags, 0);
    let payload = Feature::to_bytes(FEATURE_GET | FEATURE_GFX_PLANE, &req.to_bytes());
    let reply = c.request(Command::DeviceFeature, &payload, &[])?;
    let (f, data) = Feature::parse(&reply).expect("a feature reply");
    assert_eq!(f.flags, FEATURE_GET | FEATURE_GFX_PLANE);
    let (plane, rest) = GfxPlane::parse(data).expect("a plane in the reply");
    assert!(rest.is_empty());
    Ok(plane)
}

fn bar0_write(c: &mut Client, offset: u32, value: u32) {
    c.region_write(0, u64::from(offset), &value.to_le_bytes())
        .unwrap();
}

#[test]
fn a_vgpu_with_a_monitor_shows_its_primary_plane_in_the_display_region() {
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn(s, true);
    let mut c = Client::connect(&path).unwrap();
    // BAR0–5, ROM, config, VGA, then the display region.
    assert_eq!(c.device_info().unwrap().1, 10);
    let region = c.region_details(9).unwrap();
    // READ | MMAP: mapped read-only, 1024x768 XRGB8888.
    assert_eq!(region.flags, 1 | 4);
    assert_eq!(region.size, 1024 * 768 * 4);
    let file: File = region.file.expect("the display region's descriptor");
    // The feature is there (PROBE of the feature, and of a region-type plane).
    let probe = Feature::to_bytes(FEATURE_PROBE | FEATURE_GET | FEATURE_GFX_PLANE, &[]);
    c.request(Command::DeviceFeature, &probe, &[]).unwrap();
    query(&mut c, GFX_PLANE_PROBE | GFX_PLANE_REGION).unwrap();
    // Refused: dma-bufs, and a request without a plane type.
    assert_eq!(errno(query(&mut c, GFX_PLANE_DMABUF)), libc::EINVAL);
    assert_eq!(
        errno(query(&mut c, GFX_PLANE_PROBE | GFX_PLANE_DMABUF)),
        libc::EINVAL
    );
    assert_eq!(errno(query(&mut c, 0)), libc::EINVAL);
    let short = Feature::to_bytes(FEATURE_GET | FEATURE_GFX_PLANE, &[0; 8]);
    assert_eq!(
        errno(c.request(Command::DeviceFeature, &short, &[])),
        libc::EINVAL
    );

    // Guest RAM, and a 16x4 XRGB picture at 0x10000 mapped by the aperture slice's first page.
    let ram = tempfile::tempfile().unwrap();
    ram.set_len(1 << 20).unwrap();
    c.dma_map(&ram, 0, 0, 1 << 20).unwrap();
    let picture: Vec<u32> = (0..64u32)
        .map(|i| (0x0010_2030 * (i + 1)) & 0x00ff_ffff)
        .collect();
    let bytes: Vec<u8> = picture.iter().flat_map(|p| p.to_le_bytes()).collect();
    ram.write_all_at(&bytes, 0x10000).unwrap();
    let entry = u64::from(mmio::GTT_MMIO_BASE) + (s.aperture.base.0 / 4096) * 8;
    c.region_write(0, entry, &(0x10000u64 | 1).to_le_bytes())
        .unwrap();
    // Nothing shown while the plane is off: size 0.
    let off = query(&mut c, GFX_PLANE_REGION).unwrap();
    assert_eq!((off.drm_format, off.size), (0, 0));
    // The plane: 64-byte stride (one unit), 16x4, surface at the slice's start, XRGB 8888 on.
    bar0_write(&mut c, PLANE_STRIDE_A, 1);
    bar0_write(&mut c, PLANE_SIZE_A, (3 << 16) | 15);
    bar0_write(&mut c, PLANE_SURF_A, s.aperture.base.0 as u32);
    bar0_write(&mut c, PLANE_CTL_A, (1 << 31) | (4 << 24));
    let p = query(&mut c, GFX_PLANE_REGION).unwrap();
    assert_eq!(p.drm_format, DRM_FORMAT_XRGB8888);
    assert_eq!(p.drm_format, 0x3432_5258);
    assert_eq!((p.width, p.height, p.stride, p.size), (16, 4, 64, 256));
    assert_eq!((p.region_index, p.drm_plane_type), (9, 1));
    assert_eq!(p.flags, GFX_PLANE_REGION);
    let mut shown = vec![0u8; 256];
    file.read_exact_at(&mut shown, 0).unwrap();
    assert_eq!(shown, bytes, "the region holds the plane's pixels");
    // The region reads the same by message.
    assert_eq!(c.region_read(9, 0, 256).unwrap(), bytes);
    // A change of the picture shows at the next query, not before; the X byte reads 0.
    ram.write_all_at(&[0xff; 4], 0x10000).unwrap();
    file.read_exact_at(&mut shown, 0).unwrap();
    assert_eq!(shown, bytes);
    query(&mut c, GFX_PLANE_REGION).unwrap();
    file.read_exact_at(&mut shown[..4], 0).unwrap();
    assert_eq!(shown[..4], [0xff, 0xff, 0xff, 0]);
    // The plane off again: nothing shown.
    bar0_write(&mut c, PLANE_CTL_A, 0);
    assert_eq!(query(&mut c, GFX_PLANE_REGION).unwrap().size, 0);
    drop(c);
    server.join().unwrap();
}

#[test]
fn without_a_monitor_there_is_no_display_region_and_no_plane() {
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn(s, false);
    let mut c = Client::connect(&path).unwrap();
    assert_eq!(c.device_info().unwrap().1, 9);
    assert_eq!(errno(c.region_info(9)), libc::EINVAL);
    let probe = Feature::to_bytes(FEATURE_PROBE | FEATURE_GET | FEATURE_GFX_PLANE, &[]);
    assert_eq!(
        errno(c.request(Command::DeviceFeature, &probe, &[])),
        libc::ENOTSUP
    );
    assert_eq!(
        errno(query(&mut c, GFX_PLANE_PROBE | GFX_PLANE_REGION)),
        libc::ENOTSUP
    );
    drop(c);
    server.join().unwrap();
}
