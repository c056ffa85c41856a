//! gmig-vmm: a small KVM VMM built from rust-vmm crates, meant to host the gmig vGPU.
//!
//! Work in progress: memfd-backed guest RAM, one vCPU in 64-bit long mode, a COM1 capture, a PCI host
//! (configuration mechanism 1) with a device trait, and MMIO exits routed to device BARs.

pub mod pci;

use std::fs::File;
use std::os::fd::FromRawFd;

use kvm_bindings::{kvm_segment, kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MmapRegion,
};

pub use pci::{PciDevice, PciHost};

/// Errors of the VMM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A KVM ioctl failed.
    #[error("KVM {what}: {source}")]
    Kvm {
        /// Which call.
        what: &'static str,
        /// The errno.
        source: kvm_ioctls::Error,
    },
    /// Guest RAM could not be made.
    #[error("guest RAM: {0}")]
    Ram(String),
    /// The guest did something the VMM does not handle.
    #[error("guest: {0}")]
    Guest(String),
}

type Result<T> = std::result::Result<T, Error>;

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { what, source }
}

/// COM1 base port.
pub const COM1: u16 = 0x3f8;
/// Where the guest program is loaded and starts.
pub const LOAD_ADDR: u64 = 0x10_0000;
const GDT_ADDR: u64 = 0x500;
const PML4_ADDR: u64 = 0x9000;

/// Makes `size` bytes of memfd-backed guest RAM at guest address 0, shareable with the vGPU and a
/// vfio-user server (the same file can be mapped elsewhere).
pub fn memfd_guest_ram(size: usize) -> Result<(GuestMemoryMmap<()>, File)> {
    // SAFETY: memfd_create with a valid NUL-terminated name; the fd is checked before use.
    let fd = unsafe { libc::memfd_create(c"gmig-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::Ram(format!(
            "memfd_create: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: fd is a fresh descriptor we own.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size as u64)
        .map_err(|e| Error::Ram(e.to_string()))?;
    let dup = file.try_clone().map_err(|e| Error::Ram(e.to_string()))?;
    let region = MmapRegion::from_file(FileOffset::new(dup, 0), size)
        .map_err(|e| Error::Ram(e.to_string()))?;
    let region = GuestRegionMmap::new(region, GuestAddress(0))
        .ok_or_else(|| Error::Ram("region overflows".into()))?;
    let mem = GuestMemoryMmap::from_regions(vec![region]).map_err(|e| Error::Ram(e.to_string()))?;
    Ok((mem, file))
}

/// A MMIO window routed to a PCI device's BAR.
#[derive(Clone, Copy, Debug)]
pub struct BarWindow {
    /// Guest-physical base.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// PCI slot of the device.
    pub slot: u8,
    /// BAR index.
    pub bar: u8,
}

/// Why `run` returned.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// The guest executed HLT.
    Halted,
    /// The exit budget ran out (the VM can be run again).
    Budget,
}

/// One VM with one vCPU.
pub struct Vm {
    _kvm: Kvm,
    vm: VmFd,
    vcpu: VcpuFd,
    mem: GuestMemoryMmap<()>,
    _ram_file: File,
    /// PCI host bridge on ports 0xCF8/0xCFC.
    pub pci: PciHost,
    /// MMIO windows of device BARs.
    pub bars: Vec<BarWindow>,
    /// Everything the guest wrote to COM1.
    pub serial: Vec<u8>,
}

impl Vm {
    /// Creates a VM with `ram_size` bytes of memfd RAM (dirty logging on) and one vCPU set up for
    /// 64-bit long mode, entering at `LOAD_ADDR` where `program` is copied.
    pub fn new(ram_size: usize, program: &[u8]) -> Result<Self> {
        let kvm_h = Kvm::new().map_err(kvm("open /dev/kvm"))?;
        let vm = kvm_h.create_vm().map_err(kvm("KVM_CREATE_VM"))?;
        let (mem, ram_file) = memfd_guest_ram(ram_size)?;
        for (slot, r) in mem.iter().enumerate() {
            let region = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: KVM_MEM_LOG_DIRTY_PAGES,
                guest_phys_addr: r.start_addr().0,
                memory_size: r.len(),
                userspace_addr: r.as_ptr() as u64,
            };
            // SAFETY: the mapping lives as long as `mem`, which the Vm owns and outlives `vm`'s use.
            unsafe { vm.set_user_memory_region(region) }
                .map_err(kvm("KVM_SET_USER_MEMORY_REGION"))?;
        }
        let vcpu = vm.create_vcpu(0).map_err(kvm("KVM_CREATE_VCPU"))?;
        let cpuid = kvm_h
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm("KVM_GET_SUPPORTED_CPUID"))?;
        vcpu.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
        mem.write_slice(program, GuestAddress(LOAD_ADDR))
            .map_err(|e| Error::Ram(e.to_string()))?;
        let v = Vm {
            _kvm: kvm_h,
            vm,
            vcpu,
            mem,
            _ram_file: ram_file,
            pci: PciHost::default(),
            bars: Vec::new(),
            serial: Vec::new(),
        };
        v.setup_long_mode()?;
        Ok(v)
    }

    /// Guest RAM (shared with devices).
    pub fn memory(&self) -> &GuestMemoryMmap<()> {
        &self.mem
    }

    /// The KVM VM (dirty log, MSI).
    pub fn vm_fd(&self) -> &VmFd {
        &self.vm
    }

    /// The vCPU (state save/restore).
    pub fn vcpu_fd(&self) -> &VcpuFd {
        &self.vcpu
    }

    fn setup_long_mode(&self) -> Result<()> {
        let w = |addr: u64, v: u64| {
            self.mem
                .write_obj(v, GuestAddress(addr))
                .map_err(|e| Error::Ram(e.to_string()))
        };
        // GDT: null, 64-bit code (0x08), data (0x10).
        w(GDT_ADDR, 0)?;
        w(GDT_ADDR + 8, 0x00af_9b00_0000_ffff)?;
        w(GDT_ADDR + 16, 0x00cf_9300_0000_ffff)?;
        // Identity map of 4 GiB of 2 MiB pages for RAM and 3..4 GiB for BARs.
        let pdpt = PML4_ADDR + 0x1000;
        w(PML4_ADDR, pdpt | 3)?;
        for gib in 0..4u64 {
            let pd = pdpt + 0x1000 * (1 + gib);
            w(pdpt + gib * 8, pd | 3)?;
            for i in 0..512u64 {
                w(pd + i * 8, (gib << 30) | (i << 21) | 0x83)?;
            }
        }
        let mut sregs = self.vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
        let code = kvm_segment {
            base: 0,
            limit: 0xffff_ffff,
            selector: 0x08,
            type_: 0xb,
            present: 1,
            dpl: 0,
            db: 0,
            s: 1,
            l: 1,
            g: 1,
            avl: 0,
            unusable: 0,
            padding: 0,
        };
        let data = kvm_segment {
            selector: 0x10,
            type_: 0x3,
            l: 0,
            db: 1,
            ..code
        };
        sregs.cs = code;
        sregs.ds = data;
        sregs.es = data;
        sregs.fs = data;
        sregs.gs = data;
        sregs.ss = data;
        sregs.gdt.base = GDT_ADDR;
        sregs.gdt.limit = 23;
        sregs.cr3 = PML4_ADDR;
        sregs.cr4 |= 1 << 5; // PAE
        sregs.cr0 = 0x8000_0031; // PG | ET | NE | PE
        sregs.efer |= 0x500; // LME | LMA
        self.vcpu.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;
        let mut regs = self.vcpu.get_regs().map_err(kvm("KVM_GET_REGS"))?;
        regs.rip = LOAD_ADDR;
        regs.rsp = LOAD_ADDR; // stack grows down below the program
        regs.rflags = 2;
        self.vcpu.set_regs(&regs).map_err(kvm("KVM_SET_REGS"))?;
        Ok(())
    }

    fn bar_at(&self, addr: u64) -> Option<(BarWindow, u64)> {
        self.bars
            .iter()
            .find(|b| addr >= b.base && addr - b.base < b.len)
            .map(|b| (*b, addr - b.base))
    }

    /// Runs the vCPU for at most `max_exits` exits.
    pub fn run(&mut self, max_exits: usize) -> Result<Stop> {
        for _ in 0..max_exits {
            let exit = self.vcpu.run().map_err(kvm("KVM_RUN"))?;
            match exit {
                VcpuExit::Hlt => return Ok(Stop::Halted),
                VcpuExit::IoOut(port, data) => {
                    if port == COM1 {
                        self.serial.extend_from_slice(data);
                    } else {
                        self.pci.pio_write(port, data);
                    }
                }
                VcpuExit::IoIn(port, data) => {
                    if port == COM1 + 5 {
                        data.fill(0x60); // LSR: transmitter empty
                    } else if !self.pci.pio_read(port, data) {
                        data.fill(0xff);
                    }
                }
                VcpuExit::MmioRead(addr, data) => {
                    let hit = self
                        .bars
                        .iter()
                        .find(|b| addr >= b.base && addr - b.base < b.len);
                    match hit.copied() {
                        Some(b) => {
                            if let Some(d) = self.pci.device(b.slot) {
                                d.bar_read(b.bar, addr - b.base, data);
                            }
                        }
                        None => data.fill(0xff),
                    }
                }
                VcpuExit::MmioWrite(addr, data) => {
                    let data = data.to_vec();
                    if let Some((b, off)) = self.bar_at(addr) {
                        if let Some(d) = self.pci.device(b.slot) {
                            d.bar_write(b.bar, off, &data);
                        }
                    }
                }
                other => return Err(Error::Guest(format!("unhandled exit {other:?}"))),
            }
        }
        Ok(Stop::Budget)
    }
}
