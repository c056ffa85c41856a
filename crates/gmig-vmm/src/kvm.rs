//! The KVM side: memfd-backed guest RAM registered with dirty logging, one vCPU set up for 64-bit
//! long mode, the exit loop (port and MMIO exits handed to a [`Bus`]), the dirty log, and the
//! vCPU's state for migration.

use std::fs::File;
use std::os::fd::FromRawFd;

use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs,
    kvm_userspace_memory_region, kvm_vcpu_events, kvm_xcrs, kvm_xsave, Msrs,
    KVM_MEM_LOG_DIRTY_PAGES,
};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MmapRegion,
};

use crate::{kvm, Error, Result};

mod dirty;
pub use dirty::{manual_protect_flags, DirtyLogMode, DirtyLogWant};

/// How a VM is made: its dirty-log mode and whether guest RAM asks for transparent huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmOptions {
    /// Which dirty-log mode to ask KVM for.
    pub dirty_log: DirtyLogWant,
    /// `madvise(MADV_HUGEPAGE)` on guest RAM (it takes effect where the kernel allows huge pages
    /// for shared memory: `/sys/kernel/mm/transparent_hugepage/shmem_enabled` not `never`; on
    /// by default, where it measured faster).
    pub thp: bool,
}

impl Default for VmOptions {
    fn default() -> Self {
        VmOptions {
            dirty_log: DirtyLogWant::default(),
            thp: true,
        }
    }
}

/// How a migration re-arms KVM's dirty log after it read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rearm {
    /// Clear (and write-protect again) exactly the pages read: a pre-copy round.
    Read,
    /// Clear nothing: the stop (the vCPU does not run again). With GET the read clears anyway.
    Keep,
    /// Negative control: clear the whole log *before* reading it, dropping every page written
    /// since the last read. Only with manual protect.
    DropUnread,
}

/// Where the guest program is loaded and starts.
pub const LOAD_ADDR: u64 = 0x10_0000;
const GDT_ADDR: u64 = 0x500;
const PML4_ADDR: u64 = 0x9000;
/// Guest-physical space identity-mapped with 2 MiB pages: RAM below, device BARs above 4 GiB.
pub const IDENTITY_MAP_GIB: u64 = 8;

/// The MSRs a migration carries (besides EFER, which travels in the special registers).
pub const MIGRATED_MSRS: [u32; 11] = [
    0x10,        // IA32_TSC
    0x174,       // SYSENTER_CS
    0x175,       // SYSENTER_ESP
    0x176,       // SYSENTER_EIP
    0x277,       // PAT
    0xc000_0081, // STAR
    0xc000_0082, // LSTAR
    0xc000_0083, // CSTAR
    0xc000_0084, // SYSCALL_MASK
    0xc000_0102, // KERNEL_GS_BASE
    0xc000_0103, // TSC_AUX
];
const MSR_IA32_TSC: u32 = 0x10;

/// Guest RAM below this guest-physical address is low RAM, which the guest program uses; the
/// device window (the BARs the guest places at 4 GiB and up) follows.
pub const LOW_RAM_MAX: u64 = 3 << 30;
/// Where RAM beyond [`LOW_RAM_MAX`] goes: above the identity-mapped space and its BARs. The guest
/// program never touches it (it is told of low RAM only); it is migrated like all guest RAM.
pub const HIGH_RAM_BASE: u64 = IDENTITY_MAP_GIB << 30;
/// The most guest RAM a VM takes.
pub const MAX_RAM: u64 = 256 << 30;

/// The guest-physical ranges `(start, length)` of `size` bytes of guest RAM: up to
/// [`LOW_RAM_MAX`] at 0, the rest at [`HIGH_RAM_BASE`].
pub fn ram_layout(size: u64) -> Vec<(u64, u64)> {
    let low = size.min(LOW_RAM_MAX);
    let mut v = vec![(0, low)];
    if size > low {
        v.push((HIGH_RAM_BASE, size - low));
    }
    v
}

/// The end of `size` bytes of guest RAM in guest-physical space (past the high part where
/// there is one).
pub fn ram_end(size: u64) -> u64 {
    ram_layout(size)
        .last()
        .map_or(0, |&(start, len)| start + len)
}

/// Makes `size` bytes of memfd-backed guest RAM laid out by [`ram_layout`] (one memfd, the high
/// part at file offset [`LOW_RAM_MAX`]), shareable with the vGPU and a vfio-user server (the same
/// file can be mapped elsewhere).
pub fn memfd_guest_ram(size: usize) -> Result<(GuestMemoryMmap<()>, File)> {
    // SAFETY: memfd_create with a valid NUL-terminated name; the fd is checked before use.
    let fd = unsafe { libc::memfd_create(c"gmig-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Error::Ram(format!(
            "memfd_create: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size as u64)
        .map_err(|e| Error::Ram(e.to_string()))?;
    let mut regions = Vec::new();
    let mut offset = 0u64;
    for (start, len) in ram_layout(size as u64) {
        let dup = file.try_clone().map_err(|e| Error::Ram(e.to_string()))?;
        let len_usize = usize::try_from(len).map_err(|e| Error::Ram(e.to_string()))?;
        let region = MmapRegion::from_file(FileOffset::new(dup, offset), len_usize)
            .map_err(|e| Error::Ram(e.to_string()))?;
        regions.push(
            GuestRegionMmap::new(region, GuestAddress(start))
                .ok_or_else(|| Error::Ram("region overflows".into()))?,
        );
        offset += len;
    }
    let mem = GuestMemoryMmap::from_regions(regions).map_err(|e| Error::Ram(e.to_string()))?;
    Ok((mem, file))
}

/// `madvise(MADV_HUGEPAGE)` on every region of `mem` (before anything touches it).
fn advise_huge(mem: &GuestMemoryMmap<()>) -> Result<()> {
    for r in mem.iter() {
        // SAFETY: the range is exactly one region's live mapping, owned by `mem`; MADV_HUGEPAGE
        // only changes how the kernel backs it, never its contents.
        let rc = unsafe { libc::madvise(r.as_ptr().cast(), r.len() as usize, libc::MADV_HUGEPAGE) };
        if rc != 0 {
            return Err(Error::Ram(format!(
                "madvise(MADV_HUGEPAGE): {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// What the VMM does with the guest's port and MMIO accesses.
pub trait Bus {
    /// A port read of `data.len()` bytes.
    fn pio_read(&mut self, port: u16, data: &mut [u8]);
    /// A port write.
    fn pio_write(&mut self, port: u16, data: &[u8]);
    /// An MMIO read at guest-physical `addr`.
    fn mmio_read(&mut self, addr: u64, data: &mut [u8]);
    /// An MMIO write.
    fn mmio_write(&mut self, addr: u64, data: &[u8]);
}

/// Why a run returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The guest executed HLT (the guest program halts when it is done).
    Halted,
    /// The exit budget ran out (the VM can be run again).
    Budget,
}

/// The vCPU's architectural state, as a migration carries it. There is no in-kernel irqchip
/// (the guest polls; see the crate docs), so there is no LAPIC state to carry.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    /// General-purpose registers, RIP, RFLAGS.
    pub regs: kvm_regs,
    /// Segments, control registers, EFER, descriptor tables.
    pub sregs: kvm_sregs,
    /// FPU/SSE/AVX state.
    pub xsave: kvm_xsave,
    /// Extended control registers (XCR0).
    pub xcrs: kvm_xcrs,
    /// Debug registers.
    pub debugregs: kvm_debugregs,
    /// Pending exceptions, interrupts, NMIs.
    pub events: kvm_vcpu_events,
    /// [`MIGRATED_MSRS`], as read.
    pub msrs: Vec<kvm_msr_entry>,
    /// The VM's kvmclock.
    pub clock: kvm_clock_data,
    /// The guest's TSC frequency, kHz.
    pub tsc_khz: u32,
    /// When the vCPU was paused (CLOCK_REALTIME, ns): the destination advances the TSC by the
    /// time the VM spent paused, so the guest sees its downtime as a TSC gap.
    pub paused_at_ns: u64,
}

/// One VM with one vCPU.
pub struct Vm {
    _kvm: Kvm,
    vm: VmFd,
    vcpu: VcpuFd,
    mem: GuestMemoryMmap<()>,
    ram_file: File,
    ram_bytes: u64,
    dirty_mode: DirtyLogMode,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("ram_bytes", &self.ram_bytes)
            .finish_non_exhaustive()
    }
}

/// Nanoseconds of CLOCK_REALTIME.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Vm {
    /// Creates a VM with `ram_size` bytes of memfd RAM (dirty logging on) and one vCPU set up for
    /// 64-bit long mode, entering at [`LOAD_ADDR`] where `program` is copied.
    pub fn new(ram_size: usize, program: &[u8]) -> Result<Self> {
        Self::with_options(ram_size, program, &VmOptions::default())
    }

    /// As [`Vm::new`], made as `opts` asks.
    pub fn with_options(ram_size: usize, program: &[u8], opts: &VmOptions) -> Result<Self> {
        if (ram_size as u64) > MAX_RAM || !ram_size.is_multiple_of(4096) || ram_size == 0 {
            return Err(Error::Ram(format!(
                "guest RAM of {ram_size} bytes: give a multiple of 4 KiB, at most {} GiB",
                MAX_RAM >> 30
            )));
        }
        let kvm_h = Kvm::new().map_err(kvm("open /dev/kvm"))?;
        let vm = kvm_h.create_vm().map_err(kvm("KVM_CREATE_VM"))?;
        let dirty_mode = dirty::enable(&vm, opts.dirty_log)?;
        let (mem, ram_file) = memfd_guest_ram(ram_size)?;
        if opts.thp {
            advise_huge(&mem)?;
        }
        for (slot, r) in mem.iter().enumerate() {
            let region = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: KVM_MEM_LOG_DIRTY_PAGES,
                guest_phys_addr: r.start_addr().0,
                memory_size: r.len(),
                userspace_addr: r.as_ptr() as u64,
            };
            // SAFETY: the mapping belongs to `mem`, which the Vm owns and keeps alive as long as
            // the VM fd that uses it; the slot does not overlap another.
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
            ram_file,
            ram_bytes: ram_size as u64,
            dirty_mode,
        };
        v.setup_long_mode()?;
        Ok(v)
    }

    /// Guest RAM (shared with devices).
    pub fn memory(&self) -> &GuestMemoryMmap<()> {
        &self.mem
    }

    /// The memfd behind guest RAM (to share it with a vfio-user server).
    pub fn ram_file(&self) -> &File {
        &self.ram_file
    }

    /// Guest RAM size in bytes.
    pub fn ram_bytes(&self) -> u64 {
        self.ram_bytes
    }

    /// The KVM VM.
    pub fn vm_fd(&self) -> &VmFd {
        &self.vm
    }

    /// The vCPU.
    pub fn vcpu_fd(&self) -> &VcpuFd {
        &self.vcpu
    }

    /// Whether KVM exposes a stable, known TSC frequency to the guest.
    pub fn tsc_khz(&self) -> u32 {
        self.vcpu.get_tsc_khz().unwrap_or(0)
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
        // Identity map of IDENTITY_MAP_GIB GiB in 2 MiB pages: RAM, then BARs above 4 GiB.
        let pdpt = PML4_ADDR + 0x1000;
        w(PML4_ADDR, pdpt | 3)?;
        for gib in 0..IDENTITY_MAP_GIB {
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
        regs.rsp = LOAD_ADDR; // the stack grows down below the program
        regs.rflags = 2;
        self.vcpu.set_regs(&regs).map_err(kvm("KVM_SET_REGS"))?;
        Ok(())
    }

    /// Runs the vCPU for at most `max_exits` exits, handing port and MMIO accesses to `bus`.
    pub fn run(&mut self, bus: &mut dyn Bus, max_exits: u64) -> Result<(Stop, u64)> {
        for n in 0..max_exits {
            match self.vcpu.run().map_err(kvm("KVM_RUN"))? {
                VcpuExit::Hlt => return Ok((Stop::Halted, n + 1)),
                VcpuExit::IoOut(port, data) => bus.pio_write(port, data),
                VcpuExit::IoIn(port, data) => bus.pio_read(port, data),
                VcpuExit::MmioRead(addr, data) => bus.mmio_read(addr, data),
                VcpuExit::MmioWrite(addr, data) => bus.mmio_write(addr, data),
                other => return Err(Error::Guest(format!("unhandled exit {other:?}"))),
            }
        }
        Ok((Stop::Budget, max_exits))
    }

    /// The end of guest RAM in guest-physical space (past the high part where there is one):
    /// dirty bitmaps cover `0..ram_end() / 4096`, with no bit set in the hole.
    pub fn ram_end(&self) -> u64 {
        ram_end(self.ram_bytes)
    }

    /// The guest-physical extents `(first gfn, pages)` of guest RAM that hold data: the memfd's
    /// data ranges (`SEEK_DATA` / `SEEK_HOLE`), so never-written RAM is neither read nor sent
    /// (reading it through the mapping would allocate it). Where the file cannot say, all of RAM.
    pub fn ram_extents(&self) -> Result<Vec<(u64, u64)>> {
        use nix::errno::Errno;
        use nix::unistd::{lseek, Whence};
        const PAGE: u64 = 4096;
        let mut out = Vec::new();
        let mut file_at = 0u64;
        for (start, len) in ram_layout(self.ram_bytes) {
            let end = file_at + len;
            let mut pos = file_at;
            while pos < end {
                let data = match lseek(&self.ram_file, pos.cast_signed(), Whence::SeekData) {
                    Ok(d) => d.cast_unsigned(),
                    Err(Errno::ENXIO) => break,
                    Err(Errno::EINVAL) => {
                        // No SEEK_DATA here: the whole range.
                        out.push(((start + pos - file_at) / PAGE, (end - pos).div_ceil(PAGE)));
                        break;
                    }
                    Err(e) => return Err(Error::Ram(format!("lseek(SEEK_DATA): {e}"))),
                };
                if data >= end {
                    break;
                }
                let hole = lseek(&self.ram_file, data.cast_signed(), Whence::SeekHole)
                    .map_err(|e| Error::Ram(format!("lseek(SEEK_HOLE): {e}")))?
                    .cast_unsigned();
                let (a, b) = (data / PAGE * PAGE, hole.min(end).div_ceil(PAGE) * PAGE);
                out.push(((start + a - file_at) / PAGE, (b - a) / PAGE));
                pos = b;
            }
            file_at = end;
        }
        Ok(out)
    }

    /// How this VM's dirty log is read.
    pub fn dirty_log_mode(&self) -> DirtyLogMode {
        self.dirty_mode
    }

    /// Arms KVM's dirty log for a migration: from here on a write to any page of guest RAM is
    /// logged. With GET, a read that clears and discards the log; with manual protect, a clear of
    /// every page (with initially-set, KVM write-protects nothing before this).
    pub fn dirty_log_start(&self) -> Result<()> {
        if !self.dirty_mode.manual() {
            self.dirty_log_slots(Rearm::Read)?;
            return Ok(());
        }
        for (slot, (_, len)) in ram_layout(self.ram_bytes).into_iter().enumerate() {
            self.clear_whole_log(slot as u32, len / 4096)?;
        }
        Ok(())
    }

    /// Manual protect: clears (and write-protects again) every page of memory slot `slot`.
    fn clear_whole_log(&self, slot: u32, pages: u64) -> Result<()> {
        let all = vec![u64::MAX; pages.div_ceil(64) as usize];
        dirty::clear(&self.vm, slot, pages, &all)
    }

    /// KVM's dirty log since the last read, one bitmap per memory slot (the ranges of
    /// [`ram_layout`], bit `n` = the slot's page `n`), re-armed as `rearm` says.
    pub fn dirty_log_slots(&self, rearm: Rearm) -> Result<Vec<Vec<u64>>> {
        let manual = self.dirty_mode.manual();
        let mut out = Vec::new();
        for (slot, (_, len)) in ram_layout(self.ram_bytes).into_iter().enumerate() {
            let slot = slot as u32;
            let pages = len / 4096;
            if manual && rearm == Rearm::DropUnread {
                self.clear_whole_log(slot, pages)?;
            }
            let words = self
                .vm
                .get_dirty_log(slot, len as usize)
                .map_err(kvm("KVM_GET_DIRTY_LOG"))?;
            if manual && rearm == Rearm::Read {
                dirty::clear(&self.vm, slot, pages, &words)?;
            }
            out.push(words);
        }
        Ok(out)
    }

    /// How much of guest RAM the kernel maps with huge pages now, in KiB (`/proc/self/smaps`:
    /// `ShmemPmdMapped` and `FilePmdMapped` of guest RAM's mappings); 0 where it cannot say.
    pub fn ram_huge_kib(&self) -> u64 {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return 0;
        };
        let ranges: Vec<(u64, u64)> = self
            .mem
            .iter()
            .map(|r| (r.as_ptr() as u64, r.as_ptr() as u64 + r.len()))
            .collect();
        let mut inside = false;
        let mut kib = 0;
        for line in smaps.lines() {
            let mut words = line.split_whitespace();
            let first = words.next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                    inside = ranges.iter().any(|&(s, e)| a < e && s < b);
                    continue;
                }
            }
            if inside && (first == "ShmemPmdMapped:" || first == "FilePmdMapped:") {
                kib += words
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        kib
    }

    /// The vCPU's state, for a migration (the vCPU must not be running: the VMM calls this
    /// between exits).
    pub fn save_vcpu(&self) -> Result<VcpuState> {
        let v = &self.vcpu;
        let mut msrs = Msrs::from_entries(
            &MIGRATED_MSRS
                .iter()
                .map(|&index| kvm_msr_entry {
                    index,
                    ..Default::default()
                })
                .collect::<Vec<_>>(),
        )
        .map_err(|e| Error::Guest(format!("MSR list: {e:?}")))?;
        let n = v.get_msrs(&mut msrs).map_err(kvm("KVM_GET_MSRS"))?;
        if n != MIGRATED_MSRS.len() {
            return Err(Error::Guest(format!(
                "KVM_GET_MSRS read {n} of {} MSRs",
                MIGRATED_MSRS.len()
            )));
        }
        Ok(VcpuState {
            regs: v.get_regs().map_err(kvm("KVM_GET_REGS"))?,
            sregs: v.get_sregs().map_err(kvm("KVM_GET_SREGS"))?,
            xsave: v.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?,
            xcrs: v.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?,
            debugregs: v.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?,
            events: v.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
            msrs: msrs.as_slice().to_vec(),
            clock: self.vm.get_clock().map_err(kvm("KVM_GET_CLOCK"))?,
            tsc_khz: self.tsc_khz(),
            paused_at_ns: realtime_ns(),
        })
    }

    /// Loads a migrated vCPU state. The TSC moves on by the wall time since the source paused,
    /// as the guest's clock would on one host.
    pub fn restore_vcpu(&self, s: &VcpuState) -> Result<()> {
        let v = &self.vcpu;
        v.set_sregs(&s.sregs).map_err(kvm("KVM_SET_SREGS"))?;
        v.set_regs(&s.regs).map_err(kvm("KVM_SET_REGS"))?;
        v.set_xcrs(&s.xcrs).map_err(kvm("KVM_SET_XCRS"))?;
        // SAFETY: `s.xsave` is a whole `kvm_xsave` as KVM_GET_XSAVE filled it (it decoded from
        // the stream into the fixed-size struct), so the kernel reads only within it.
        unsafe { v.set_xsave(&s.xsave) }.map_err(kvm("KVM_SET_XSAVE"))?;
        v.set_debug_regs(&s.debugregs)
            .map_err(kvm("KVM_SET_DEBUGREGS"))?;
        v.set_vcpu_events(&s.events)
            .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
        let paused_ns = realtime_ns().saturating_sub(s.paused_at_ns);
        let advance = paused_ns.saturating_mul(u64::from(s.tsc_khz)) / 1_000_000;
        let entries: Vec<kvm_msr_entry> = s
            .msrs
            .iter()
            .map(|e| {
                let mut e = *e;
                if e.index == MSR_IA32_TSC {
                    e.data = e.data.wrapping_add(advance);
                }
                e
            })
            .collect();
        let msrs =
            Msrs::from_entries(&entries).map_err(|e| Error::Guest(format!("MSR list: {e:?}")))?;
        let n = v.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
        if n != entries.len() {
            return Err(Error::Guest(format!(
                "KVM_SET_MSRS wrote {n} of {} MSRs",
                entries.len()
            )));
        }
        let mut clock = s.clock;
        clock.clock = clock.clock.saturating_add(paused_ns);
        clock.flags = 0;
        self.vm.set_clock(&clock).map_err(kvm("KVM_SET_CLOCK"))?;
        Ok(())
    }
}
