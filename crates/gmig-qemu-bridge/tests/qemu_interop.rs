//! What stock QEMU's vfio-user client (10.2, `-device vfio-user-pci`) sends and needs, replayed
//! against `gmig serve`'s vGPU: the VERSION it offers (minor 0, its capability set), DMA maps of
//! ROM sections that come without a file descriptor, INTx as the configuration space advertises
//! it (QEMU enables INTx at realize whenever the interrupt pin is set), and guest RAM mapped in
//! several sections that change while the guest boots.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use gmig_cmdparser::VgpuSlices;
use gmig_qemu_bridge::client::{Client, ClientError};
use gmig_qemu_bridge::proto::{Command, Header, Put, Reader, FLAG_ERROR, HEADER_LEN};
use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec};
use gmig_vgpu::gm::VgpuType;
use gmig_vgpu::mmio;
use gmig_vgpu::workload::Profile;

mod common;

const TY: VgpuType = VgpuType::V5_8;
const CONFIG: u32 = 7;
const INTX: u32 = 0;
const MSI: u32 = 1;
/// `VFIO_IRQ_SET_*` (`linux/vfio.h`).
const DATA_NONE: u32 = 1;
const DATA_BOOL: u32 = 1 << 1;
const DATA_EVENTFD: u32 = 1 << 2;
const ACTION_MASK: u32 = 1 << 3;
const ACTION_UNMASK: u32 = 1 << 4;
const ACTION_TRIGGER: u32 = 1 << 5;
/// `VFIO_IRQ_INFO_*`.
const INFO_EVENTFD: u32 = 1;
const INFO_MASKABLE: u32 = 1 << 1;
const INFO_AUTOMASKED: u32 = 1 << 2;

/// The capabilities QEMU 10.2's client proposes (`hw/vfio-user/proxy.c`, `caps_json`).
const QEMU_CAPS: &str = r#"{"capabilities":{"migration":{"pgsize":4096,"max_bitmap_size":268435456},"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"max_dma_maps":65535,"write_multiple":true}}"#;

fn spawn(
    slices: VgpuSlices,
    clients: usize,
) -> (PathBuf, JoinHandle<VgpuBackend>, tempfile::TempDir) {
    spawn_with(slices, clients, None)
}

/// A server for `clients` clients in turn, its vGPU driven by the guest-driver model for
/// `profile` if given.
fn spawn_with(
    slices: VgpuSlices,
    clients: usize,
    profile: Option<Profile>,
) -> (PathBuf, JoinHandle<VgpuBackend>, tempfile::TempDir) {
    let spec = VgpuSpec {
        profile: profile.map(|p| (p, 5)),
        ..common::spec(TY, slices, true)
    };
    common::serve(spec, clients)
}

fn refused(r: Result<impl std::fmt::Debug, ClientError>) -> i32 {
    match r {
        Err(ClientError::Refused { errno, .. }) => errno,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// One VERSION exchange on a raw socket: the client offers `0.minor` with `caps`; returns the
/// reply's minor and its capability text (NUL-terminated as the spec wants, checked here).
fn negotiate(path: &Path, minor: u16, caps: &str) -> (u16, String) {
    let mut s = UnixStream::connect(path).unwrap();
    let mut p = Vec::new();
    p.put16(0);
    p.put16(minor);
    p.extend_from_slice(caps.as_bytes());
    p.push(0);
    let mut m = Header::command(1, Command::Version, p.len())
        .to_bytes()
        .to_vec();
    m.extend_from_slice(&p);
    s.write_all(&m).unwrap();
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).unwrap();
    let h = Header::parse(&head, 1 << 20).unwrap();
    assert!(h.is_reply() && h.flags & FLAG_ERROR == 0, "{h:?}");
    let mut body = vec![0u8; h.payload_len()];
    s.read_exact(&mut body).unwrap();
    let mut r = Reader::new(&body);
    assert_eq!(r.u16().unwrap(), 0, "major");
    let got = r.u16().unwrap();
    let text = r.rest();
    assert_eq!(text.last(), Some(&0), "capabilities end with a NUL");
    (
        got,
        String::from_utf8(text[..text.len() - 1].to_vec()).unwrap(),
    )
}

/// What QEMU's `caps_check` accepts (and warns about nothing): one top-level key,
/// `capabilities`, holding only keys QEMU knows, each within QEMU's bounds.
fn assert_qemu_accepts(caps: &str) {
    let v: serde_json::Value = serde_json::from_str(caps).unwrap();
    let top = v.as_object().unwrap();
    assert_eq!(top.keys().collect::<Vec<_>>(), ["capabilities"], "{caps}");
    let c = top["capabilities"].as_object().unwrap();
    for (k, val) in c {
        match k.as_str() {
            "max_msg_fds" => assert!(val.as_u64().unwrap() <= 16),
            "max_data_xfer_size" => assert!(val.as_u64().unwrap() <= 64 << 20),
            "pgsizes" => assert_eq!(val.as_u64().unwrap() % 4096, 0),
            "max_dma_maps" => assert!(val.as_u64().unwrap() <= 65535),
            "write_multiple" => assert!(val.is_boolean()),
            "migration" => {
                for (k, val) in val.as_object().unwrap() {
                    match k.as_str() {
                        "pgsize" => assert_eq!(val.as_u64().unwrap() % 4096, 0),
                        "max_bitmap_size" => assert!(val.as_u64().unwrap() <= 256 << 20),
                        other => panic!("QEMU does not know migration.{other}: {caps}"),
                    }
                }
            }
            other => panic!("QEMU does not know capability {other}: {caps}"),
        }
    }
}

#[test]
fn a_client_offering_minor_0_gets_minor_0_and_capabilities_qemu_accepts() {
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn(s, 3);
    // QEMU 10.2 offers 0.0 and refuses a reply whose minor is above what it offered.
    let (minor, caps) = negotiate(&path, 0, QEMU_CAPS);
    assert_eq!(minor, 0, "{caps}");
    assert_qemu_accepts(&caps);
    // The rust-vmm client offers 0.1; a newer client than this server gets this server's minor.
    assert_eq!(negotiate(&path, 1, "{}").0, 1);
    assert_eq!(negotiate(&path, 9, "{}").0, 2);
    server.join().unwrap();
}

/// One RAM file standing in for QEMU's memfd, mapped in sections.
fn ram_file(size: u64) -> File {
    let f = tempfile::tempfile().unwrap();
    f.set_len(size).unwrap();
    f
}

/// The BAR0 offset of the GGTT entry for the `page`th page of the aperture slice.
fn ggtt_entry(s: &VgpuSlices, page: u64) -> u64 {
    u64::from(mmio::GTT_MMIO_BASE) + (s.aperture.base.0 / 4096 + page) * 8
}

fn map_page(c: &mut Client, s: &VgpuSlices, page: u64, gpa: u64) {
    c.region_write(0, ggtt_entry(s, page), &(gpa | 1).to_le_bytes())
        .unwrap();
}

const BIOS: u64 = 0xfffc_0000;
const BIOS_SIZE: u64 = 0x4_0000;

#[test]
fn a_rom_mapped_without_a_descriptor_is_accepted_unused_and_unmapped() {
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn(s, 1);
    let mut c = Client::connect(&path).unwrap();
    let ram = ram_file(32 << 20);
    c.dma_map(&ram, 0, 0, 32 << 20).unwrap();
    // QEMU maps the BIOS ROM (no descriptor: it is not in the memory backend) like any section;
    // a device behind an IOMMU that cannot use it still takes the map.
    c.dma_map_local(BIOS, BIOS_SIZE).unwrap();
    // A GPU access into it is unbacked: a write is dropped, a read gives zeroes, and the server
    // never asks the client for the bytes.
    map_page(&mut c, &s, 0, BIOS + 0x1000);
    let ap = s.aperture.base.0;
    c.region_write(2, ap + 8, b"rom?").unwrap();
    assert_eq!(c.region_read(2, ap + 8, 4).unwrap(), [0; 4]);
    assert_eq!(c.local_memory(BIOS + 0x1008, 4).unwrap(), [0; 4]);
    assert_eq!(c.dma_requests_served(), 0);
    // RAM still works, and the ROM's unmap is accepted too.
    map_page(&mut c, &s, 1, 0x7000);
    c.region_write(2, ap + 4096, b"ram!").unwrap();
    let mut got = [0u8; 4];
    ram.read_exact_at(&mut got, 0x7000).unwrap();
    assert_eq!(&got, b"ram!");
    c.dma_unmap(BIOS, BIOS_SIZE).unwrap();
    // Unmapping what was never mapped is still refused.
    assert_eq!(refused(c.dma_unmap(BIOS, BIOS_SIZE)), libc::EINVAL);
    drop(c);
    assert!(server.join().unwrap().vm().is_some());
}

fn irq_info_request(c: &mut Client, index: u32) -> Result<Vec<u8>, ClientError> {
    let mut p = Vec::new();
    p.put32(16);
    p.put32(0);
    p.put32(index);
    p.put32(0);
    c.request(Command::DeviceGetIrqInfo, &p, &[])
}

fn irq_info(c: &mut Client, index: u32) -> (u32, u32) {
    let r = irq_info_request(c, index).unwrap();
    let mut r = Reader::new(&r);
    let (_argsz, flags, got, count) = (
        r.u32().unwrap(),
        r.u32().unwrap(),
        r.u32().unwrap(),
        r.u32().unwrap(),
    );
    assert_eq!(got, index);
    (flags, count)
}

/// SET_IRQS as QEMU sends it: argsz 20, data (booleans) after the header, eventfds alongside.
fn set_irqs(
    c: &mut Client,
    index: u32,
    flags: u32,
    (start, count): (u32, u32),
    data: &[u8],
    fds: &[&File],
) -> Result<Vec<u8>, ClientError> {
    let mut p = Vec::new();
    p.put32(20 + data.len() as u32);
    p.put32(flags);
    p.put32(index);
    p.put32(start);
    p.put32(count);
    p.extend_from_slice(data);
    c.request(Command::DeviceSetIrqs, &p, fds)
}

/// An eventfd stand-in: the server's end and a non-blocking end to count signals on.
fn signal_pair() -> (File, UnixStream) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    (File::from(std::os::fd::OwnedFd::from(theirs)), ours)
}

/// The signals (8-byte writes) that arrived since the last call.
fn signals(rx: &mut UnixStream) -> usize {
    let mut n = 0;
    let mut b = [0u8; 8];
    while rx.read_exact(&mut b).is_ok() {
        n += 1;
    }
    n
}

#[test]
fn intx_is_offered_as_config_space_advertises_it_and_qemus_set_irqs_succeed() {
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn(s, 1);
    let mut c = Client::connect(&path).unwrap();
    let pin = c.region_read(CONFIG, 0x3d, 1).unwrap()[0];
    let (flags, count) = irq_info(&mut c, INTX);
    // QEMU enables INTx at realize when the pin is set and fails realize if SET_IRQS refuses it:
    // pin and INTx info must agree. An Intel iGPU has INTA#; vfio-pci reports INTx as eventfd,
    // maskable and automasked.
    assert_eq!(pin, 1);
    assert_eq!(count, 1);
    assert_eq!(
        flags,
        INFO_EVENTFD | INFO_MASKABLE | INFO_AUTOMASKED,
        "{flags:#x}"
    );
    assert_eq!(irq_info(&mut c, MSI), (INFO_EVENTFD, 1));
    // No MSI-X; no error-reporting IRQ, which (as vfio-pci does for a function without PCI
    // Express) does not exist at all: QEMU then sets up no AER and warns of nothing.
    assert_eq!(irq_info(&mut c, 2), (0, 0));
    assert_eq!(refused(irq_info_request(&mut c, 3)), libc::EINVAL);
    assert_eq!(irq_info(&mut c, 4), (0, 0));

    // vfio_intx_enable: the trigger eventfd.
    let (tx, mut rx) = signal_pair();
    set_irqs(
        &mut c,
        INTX,
        DATA_EVENTFD | ACTION_TRIGGER,
        (0, 1),
        &[],
        &[&tx],
    )
    .unwrap();
    // A trigger signals and automasks: a second one waits for the unmask QEMU sends at EOI.
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_TRIGGER, (0, 1), &[], &[]).unwrap();
    assert_eq!(signals(&mut rx), 1);
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_TRIGGER, (0, 1), &[], &[]).unwrap();
    assert_eq!(signals(&mut rx), 0, "masked until unmasked");
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_UNMASK, (0, 1), &[], &[]).unwrap();
    assert_eq!(
        signals(&mut rx),
        1,
        "the pending interrupt after the unmask"
    );
    // Mask and unmask by booleans; a false one does nothing.
    set_irqs(&mut c, INTX, DATA_BOOL | ACTION_UNMASK, (0, 1), &[0], &[]).unwrap();
    set_irqs(&mut c, INTX, DATA_BOOL | ACTION_UNMASK, (0, 1), &[1], &[]).unwrap();
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_MASK, (0, 1), &[], &[]).unwrap();
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_TRIGGER, (0, 1), &[], &[]).unwrap();
    assert_eq!(signals(&mut rx), 0);
    // vfio_intx_disable / vfio_device_irq_disable: DATA_NONE | TRIGGER with count 0; then a
    // de-assign by DATA_EVENTFD without descriptors (what QEMU sends for an fd of -1).
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_TRIGGER, (0, 0), &[], &[]).unwrap();
    set_irqs(
        &mut c,
        INTX,
        DATA_EVENTFD | ACTION_TRIGGER,
        (0, 1),
        &[],
        &[],
    )
    .unwrap();
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_UNMASK, (0, 1), &[], &[]).unwrap();
    assert_eq!(signals(&mut rx), 0, "no trigger left to signal");

    // MSI: enable with an eventfd, disable with count 0; it cannot be masked (as in vfio-pci).
    let (mtx, mut mrx) = signal_pair();
    set_irqs(
        &mut c,
        MSI,
        DATA_EVENTFD | ACTION_TRIGGER,
        (0, 1),
        &[],
        &[&mtx],
    )
    .unwrap();
    set_irqs(&mut c, MSI, DATA_NONE | ACTION_TRIGGER, (0, 1), &[], &[]).unwrap();
    assert_eq!(signals(&mut mrx), 1);
    assert_eq!(
        refused(set_irqs(
            &mut c,
            MSI,
            DATA_NONE | ACTION_UNMASK,
            (0, 1),
            &[],
            &[]
        )),
        libc::EINVAL
    );
    set_irqs(&mut c, MSI, DATA_NONE | ACTION_TRIGGER, (0, 0), &[], &[]).unwrap();
    set_irqs(&mut c, MSI, DATA_NONE | ACTION_TRIGGER, (0, 1), &[], &[]).unwrap();
    assert_eq!(signals(&mut mrx), 0);

    // Malformed requests are still refused: two data flags, no action, too many vectors.
    for (flags, range) in [
        (DATA_NONE | DATA_BOOL | ACTION_TRIGGER, (0, 1)),
        (DATA_NONE, (0, 1)),
        (DATA_NONE | ACTION_TRIGGER, (0, 2)),
        (DATA_NONE | ACTION_TRIGGER, (1, 1)),
    ] {
        assert_eq!(
            refused(set_irqs(&mut c, INTX, flags, range, &[], &[])),
            libc::EINVAL,
            "{flags:#x} {range:?}"
        );
    }
    // Booleans missing.
    assert_eq!(
        refused(set_irqs(
            &mut c,
            INTX,
            DATA_BOOL | ACTION_MASK,
            (0, 1),
            &[],
            &[]
        )),
        libc::EINVAL
    );
    drop(c);
    server.join().unwrap();
}

/// QEMU's q35 sections of a 1 GiB guest, scaled down: RAM below 640 KiB, RAM from 1 MiB, and RAM
/// above 4 GiB, all in one memory-backend file at increasing offsets.
const LOW: (u64, u64, u64) = (0, 0xa_0000, 0);
const MID: (u64, u64, u64) = (0x10_0000, 0x1f0_0000, 0x10_0000);
const HIGH: (u64, u64, u64) = (0x1_0000_0000, 0x100_0000, 0x200_0000);

fn map(c: &mut Client, ram: &File, (gpa, size, offset): (u64, u64, u64)) {
    c.dma_map(ram, offset, gpa, size).unwrap();
}

fn file_bytes(ram: &File, (gpa, _, offset): (u64, u64, u64), at: u64, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    ram.read_exact_at(&mut b, offset + (at - gpa)).unwrap();
    b
}

#[test]
fn every_descriptor_backed_section_is_guest_memory_and_an_unmapped_one_is_dropped() {
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn(s, 1);
    let mut c = Client::connect(&path).unwrap();
    let ram = ram_file(HIGH.2 + 2 * HIGH.1);
    let ap = s.aperture.base.0;
    let high_page = HIGH.0 + 0x5000;
    let mid_page = MID.0 + 0x3000;

    // The vGPU comes to life on the first section; the guest points a GGTT entry above 4 GiB
    // before that RAM is mapped: the write has nowhere to go.
    map(&mut c, &ram, LOW);
    map_page(&mut c, &s, 0, high_page);
    c.region_write(2, ap + 0x10, b"early").unwrap();
    assert_eq!(file_bytes(&ram, HIGH, high_page + 0x10, 5), [0; 5]);

    // The other sections arrive: the vGPU keeps its state (the GGTT entry) and now reaches every
    // section.
    map(&mut c, &ram, MID);
    map(&mut c, &ram, HIGH);
    c.region_write(2, ap + 0x10, b"high!").unwrap();
    assert_eq!(file_bytes(&ram, HIGH, high_page + 0x10, 5), b"high!");
    map_page(&mut c, &s, 1, mid_page);
    c.region_write(2, ap + 4096, b"mid!").unwrap();
    assert_eq!(file_bytes(&ram, MID, mid_page, 4), b"mid!");
    map_page(&mut c, &s, 2, 0x9000);
    c.region_write(2, ap + 2 * 4096, b"low!").unwrap();
    assert_eq!(file_bytes(&ram, LOW, 0x9000, 4), b"low!");

    // DMA logging over "every mapped region" (no ranges, a ROM without a descriptor among them)
    // sees a write above 4 GiB.
    c.dma_map_local(BIOS, BIOS_SIZE).unwrap();
    assert_eq!(c.dma_logging_start(4096, &[]).unwrap(), 4096);
    c.region_write(2, ap + 0x20, b"dirty").unwrap();
    let bits = c.dma_logging_report(HIGH.0, HIGH.1, 4096).unwrap();
    assert_eq!(bits[0], 1 << 5, "{bits:x?}");
    c.dma_logging_stop().unwrap();

    // The section above 4 GiB goes away (as when QEMU reshapes its memory map): the vGPU no
    // longer writes there; the rest still works.
    c.dma_unmap(HIGH.0, HIGH.1).unwrap();
    c.region_write(2, ap + 0x10, b"gone?").unwrap();
    assert_eq!(file_bytes(&ram, HIGH, high_page + 0x10, 5), b"high!");
    assert_eq!(c.region_read(2, ap + 0x10, 5).unwrap(), [0; 5]);
    c.region_write(2, ap + 4096, b"MID!").unwrap();
    assert_eq!(file_bytes(&ram, MID, mid_page, 4), b"MID!");
    // Mapped again at another offset of the file (QEMU moved the backing): the new bytes are used.
    let moved = (HIGH.0, HIGH.1, HIGH.2 + HIGH.1);
    map(&mut c, &ram, moved);
    c.region_write(2, ap + 0x10, b"again").unwrap();
    assert_eq!(file_bytes(&ram, moved, high_page + 0x10, 5), b"again");
    drop(c);
    let backend = server.join().unwrap();
    assert!(backend.vm().unwrap().vgpu().faults().is_empty());
}

#[test]
fn config_space_reads_of_any_length_see_what_qemu_parses() {
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn(s, 1);
    let mut c = Client::connect(&path).unwrap();
    // vfio_pci_config_setup copies the whole config space with one 256-byte read and parses the
    // capability list (MSI) from that copy: it must hold what dword reads see.
    let whole = c.region_read(CONFIG, 0, 256).unwrap();
    let mut dwords = Vec::new();
    for at in (0..256).step_by(4) {
        dwords.extend(c.region_read(CONFIG, at, 4).unwrap());
    }
    assert_eq!(whole, dwords);
    assert_eq!(&whole[..4], &[0x86, 0x80, 0x12, 0x19]);
    assert_ne!(whole[0x06] & 0x10, 0, "capability list");
    let cap = usize::from(whole[0x34]);
    assert_eq!(whole[cap], 0x05, "MSI");
    assert_eq!(whole[0x3d], 1, "INTA#");
    // Unaligned and odd-sized reads too.
    assert_eq!(c.region_read(CONFIG, 3, 6).unwrap(), &whole[3..9]);
    assert_eq!(c.region_read(CONFIG, 0x8e, 7).unwrap(), &whole[0x8e..0x95]);
    // A write of several bytes reaches each register it covers: the MSI address and data.
    let mut msi = Vec::new();
    msi.extend_from_slice(&0xfee0_0000u32.to_le_bytes());
    msi.extend_from_slice(&0u32.to_le_bytes());
    msi.extend_from_slice(&0x4041u16.to_le_bytes());
    c.region_write(CONFIG, cap as u64 + 4, &msi).unwrap();
    assert_eq!(
        c.region_read(CONFIG, cap as u64 + 4, 10).unwrap(),
        msi.as_slice()
    );
    drop(c);
    server.join().unwrap();
}

#[test]
fn the_gpus_interrupts_go_by_intx_until_the_guest_enables_msi() {
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn_with(s, 1, Some(Profile::Desktop));
    let mut c = Client::connect(&path).unwrap();
    let ram = ram_file(32 << 20);
    c.dma_map(&ram, 0, 0, 32 << 20).unwrap();
    let (tx, mut rx) = signal_pair();
    set_irqs(
        &mut c,
        INTX,
        DATA_EVENTFD | ACTION_TRIGGER,
        (0, 1),
        &[],
        &[&tx],
    )
    .unwrap();
    // The guest-driver model submits frames (each ends in MI_USER_INTERRUPT) every few messages;
    // a BAR0 write lets the GPU report what it raised.
    let work = |c: &mut Client| {
        for _ in 0..12 {
            c.region_read(CONFIG, 0, 4).unwrap();
        }
        c.region_write(0, u64::from(mmio::VGT_PVINFO_PAGE) + 0x800, &[0; 4])
            .unwrap();
    };
    work(&mut c);
    assert_eq!(signals(&mut rx), 1, "INTx, then masked");
    work(&mut c);
    assert_eq!(signals(&mut rx), 0, "masked until the EOI's unmask");
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_UNMASK, (0, 1), &[], &[]).unwrap();
    assert_eq!(signals(&mut rx), 1);
    // The guest disables INTx in the command register: nothing more on INTx.
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_UNMASK, (0, 1), &[], &[]).unwrap();
    let command = c.region_read(CONFIG, 4, 2).unwrap();
    let command = u16::from_le_bytes([command[0], command[1]]) | (1 << 10);
    c.region_write(CONFIG, 4, &command.to_le_bytes()).unwrap();
    work(&mut c);
    assert_eq!(signals(&mut rx), 0);
    // MSI enabled (as QEMU does it: INTx torn down, the MSI eventfd set, the capability's enable
    // bit written through): interrupts go there.
    set_irqs(&mut c, INTX, DATA_NONE | ACTION_TRIGGER, (0, 0), &[], &[]).unwrap();
    let (mtx, mut mrx) = signal_pair();
    set_irqs(
        &mut c,
        MSI,
        DATA_EVENTFD | ACTION_TRIGGER,
        (0, 1),
        &[],
        &[&mtx],
    )
    .unwrap();
    let cap = u64::from(c.region_read(CONFIG, 0x34, 1).unwrap()[0]);
    c.region_write(CONFIG, cap + 2, &[0x81, 0]).unwrap();
    work(&mut c);
    assert!(signals(&mut mrx) >= 1, "MSI");
    assert_eq!(signals(&mut rx), 0);
    drop(c);
    server.join().unwrap();
}

#[test]
fn msi_armed_by_set_irqs_is_used_without_the_capabilitys_enable_bit() {
    // A migration destination: QEMU restores MSI in its own copy of the configuration space and
    // arms it with SET_IRQS, but never writes the capability's enable bit to the device (kernel
    // vfio-pci has the same split). The interrupts must go by MSI all the same.
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn_with(s, 1, Some(Profile::Desktop));
    let mut c = Client::connect(&path).unwrap();
    let ram = ram_file(32 << 20);
    c.dma_map(&ram, 0, 0, 32 << 20).unwrap();
    let (tx, mut rx) = signal_pair();
    set_irqs(
        &mut c,
        INTX,
        DATA_EVENTFD | ACTION_TRIGGER,
        (0, 1),
        &[],
        &[&tx],
    )
    .unwrap();
    let (mtx, mut mrx) = signal_pair();
    set_irqs(
        &mut c,
        MSI,
        DATA_EVENTFD | ACTION_TRIGGER,
        (0, 1),
        &[],
        &[&mtx],
    )
    .unwrap();
    let cap = u64::from(c.region_read(CONFIG, 0x34, 1).unwrap()[0]);
    assert_eq!(
        c.region_read(CONFIG, cap + 2, 1).unwrap()[0] & 1,
        0,
        "MSI off in config space"
    );
    let work = |c: &mut Client| {
        for _ in 0..12 {
            c.region_read(CONFIG, 0, 4).unwrap();
        }
        c.region_write(0, u64::from(mmio::VGT_PVINFO_PAGE) + 0x800, &[0; 4])
            .unwrap();
    };
    work(&mut c);
    assert!(signals(&mut mrx) >= 1, "MSI");
    assert_eq!(signals(&mut rx), 0, "no INTx while MSI is armed");
    // Disarmed (count 0): back to INTx.
    set_irqs(&mut c, MSI, DATA_NONE | ACTION_TRIGGER, (0, 0), &[], &[]).unwrap();
    work(&mut c);
    assert_eq!(signals(&mut mrx), 0);
    assert_eq!(signals(&mut rx), 1, "INTx");
    drop(c);
    server.join().unwrap();
}

#[test]
fn memory_that_changes_during_a_migration_is_followed_once_it_ends() {
    use gmig_vfio_migration::DeviceState;
    let (s, _) = gmig_test_support::moved_slices(TY);
    let (path, server, _dir) = spawn(s, 1);
    let mut c = Client::connect(&path).unwrap();
    let ram = ram_file(HIGH.2 + HIGH.1);
    map(&mut c, &ram, LOW);
    map(&mut c, &ram, MID);
    let ap = s.aperture.base.0;
    map_page(&mut c, &s, 0, HIGH.0 + 0x2000);
    c.set_device_state(DeviceState::PreCopy).unwrap();
    let mut stream = Vec::new();
    while let Some(chunk) = c.mig_read(64 * 1024).unwrap() {
        stream.extend(chunk);
    }
    // A section arrives mid-migration: the migration goes on over the memory it began with (its
    // stream stays whole); the vGPU takes the new section once the device runs again.
    map(&mut c, &ram, HIGH);
    c.region_write(2, ap, b"wait").unwrap();
    assert_eq!(file_bytes(&ram, HIGH, HIGH.0 + 0x2000, 4), [0; 4]);
    c.set_device_state(DeviceState::StopCopy).unwrap();
    loop {
        let chunk = c.mig_read(64 * 1024).unwrap().unwrap();
        if chunk.is_empty() {
            break;
        }
        stream.extend(chunk);
    }
    assert!(!stream.is_empty());
    c.set_device_state(DeviceState::Stop).unwrap();
    c.set_device_state(DeviceState::Running).unwrap();
    c.region_write(2, ap, b"back").unwrap();
    assert_eq!(file_bytes(&ram, HIGH, HIGH.0 + 0x2000, 4), b"back");
    drop(c);
    server.join().unwrap();
}
