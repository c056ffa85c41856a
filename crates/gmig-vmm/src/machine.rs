//! A whole VM: the KVM vCPU and RAM, COM1 (vm-superio's 16550), PCI configuration mechanism 1
//! with the vGPU at 00:00.0, and the vGPU's BARs. The VMM is single-threaded: the vGPU makes
//! progress on the guest's own device accesses (it polls a register while it waits), so a run is
//! the same exits in the same order every time, in process or over vfio-user.

use std::fs::File;

use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::gpu::{GpuLink, GpuPci};
use crate::guest::{GuestConfig, Telemetry};
use crate::kvm::{Bus, Stop, Vm, VmOptions};
use crate::pci::{CONFIG_ADDRESS, CONFIG_DATA};
use crate::{Error, Result};

/// COM1's base port.
pub const COM1: u16 = 0x3f8;

/// The serial port's interrupt line: there is no interrupt controller, so it goes nowhere.
#[derive(Debug)]
pub struct NoIrq;

impl Trigger for NoIrq {
    type E = std::convert::Infallible;
    fn trigger(&self) -> std::result::Result<(), Self::E> {
        Ok(())
    }
}

type Com1 = Serial<NoIrq, NoEvents, Vec<u8>>;

/// The devices on the VM's buses.
pub struct Board {
    serial: Com1,
    cf8: u32,
    gpu: GpuPci,
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board")
            .field("gpu", &self.gpu)
            .finish_non_exhaustive()
    }
}

impl Board {
    /// The vGPU's slot is 0 on bus 0; anything else has no device.
    fn gpu_config(&self) -> Option<u16> {
        let a = self.cf8;
        let (bus, dev, func) = ((a >> 16) & 0xff, (a >> 11) & 0x1f, (a >> 8) & 7);
        (a & 0x8000_0000 != 0 && bus == 0 && dev == 0 && func == 0).then_some((a & 0xfc) as u16)
    }
}

impl Bus for Board {
    fn pio_read(&mut self, port: u16, data: &mut [u8]) {
        use crate::pci::PciDevice;
        match port {
            p if (COM1..COM1 + 8).contains(&p) && data.len() == 1 => {
                data[0] = self.serial.read((p - COM1) as u8);
            }
            CONFIG_ADDRESS if data.len() == 4 => data.copy_from_slice(&self.cf8.to_le_bytes()),
            p if (CONFIG_DATA..CONFIG_DATA + 4).contains(&p) => {
                let v = match self.gpu_config() {
                    Some(off) => self.gpu.config_read(off),
                    None => u32::MAX,
                };
                let shift = (p - CONFIG_DATA) as usize;
                let bytes = v.to_le_bytes();
                for (i, b) in data.iter_mut().enumerate() {
                    *b = *bytes.get(shift + i).unwrap_or(&0xff);
                }
            }
            _ => data.fill(0xff),
        }
    }

    fn pio_write(&mut self, port: u16, data: &[u8]) {
        use crate::pci::PciDevice;
        match port {
            p if (COM1..COM1 + 8).contains(&p) && data.len() == 1 => {
                // The trigger cannot fail and the output is a Vec.
                let _ = self.serial.write((p - COM1) as u8, data[0]);
            }
            CONFIG_ADDRESS if data.len() == 4 => {
                self.cf8 = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            }
            p if (CONFIG_DATA..CONFIG_DATA + 4).contains(&p) => {
                if let Some(off) = self.gpu_config() {
                    // Sub-dword writes merge into the register, as a host bridge does.
                    let shift = (p - CONFIG_DATA) as usize;
                    let mut bytes = if data.len() == 4 {
                        [0; 4]
                    } else {
                        self.gpu.config_read(off).to_le_bytes()
                    };
                    for (i, b) in data.iter().enumerate() {
                        if let Some(s) = bytes.get_mut(shift + i) {
                            *s = *b;
                        }
                    }
                    self.gpu.config_write(off, u32::from_le_bytes(bytes));
                }
            }
            _ => {}
        }
    }

    fn mmio_read(&mut self, addr: u64, data: &mut [u8]) {
        if !self.gpu.mmio_read(addr, data) {
            data.fill(0xff);
        }
    }

    fn mmio_write(&mut self, addr: u64, data: &[u8]) {
        self.gpu.mmio_write(addr, data);
    }
}

/// COM1's registers and output, as a migration carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SerialSnapshot {
    /// DLL, DLM, IER, IIR, LCR, LSR, MCR, MSR, SCR.
    pub regs: [u8; 9],
    /// Bytes received and not yet read by the guest.
    pub in_buffer: Vec<u8>,
    /// Everything the guest has written so far.
    pub output: Vec<u8>,
}

/// One VM running the guest GPU driver on a vGPU.
pub struct Machine {
    vm: Vm,
    board: Board,
    msi: EventFd,
    msis: u64,
    /// Exits handled so far.
    pub exits: u64,
    halted: bool,
}

impl std::fmt::Debug for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("vm", &self.vm)
            .field("exits", &self.exits)
            .finish_non_exhaustive()
    }
}

impl Machine {
    /// A VM of `ram_bytes` running the guest program with `cfg`, on the vGPU behind `link`.
    pub fn boot(ram_bytes: u64, cfg: &GuestConfig, link: Box<dyn GpuLink>) -> Result<Machine> {
        Self::boot_with(ram_bytes, cfg, link, &VmOptions::default())
    }

    /// As [`Machine::boot`], the VM made as `opts` asks.
    pub fn boot_with(
        ram_bytes: u64,
        cfg: &GuestConfig,
        link: Box<dyn GpuLink>,
        opts: &VmOptions,
    ) -> Result<Machine> {
        let vm = Vm::with_options(ram_size(ram_bytes)?, crate::guest::IMAGE, opts)?;
        // The guest program is told of low RAM only: RAM above it is migrated, never used.
        cfg.write(
            vm.memory(),
            ram_bytes.min(crate::kvm::LOW_RAM_MAX),
            vm.tsc_khz(),
        )?;
        Self::assemble(vm, link, Com1::new(NoIrq, Vec::new()))
    }

    /// A VM of `ram_bytes` with nothing in its RAM, for an incoming migration to fill.
    pub fn incoming(ram_bytes: u64, link: Box<dyn GpuLink>) -> Result<Machine> {
        Self::incoming_with(ram_bytes, link, &VmOptions::default())
    }

    /// As [`Machine::incoming`], the VM made as `opts` asks.
    pub fn incoming_with(
        ram_bytes: u64,
        link: Box<dyn GpuLink>,
        opts: &VmOptions,
    ) -> Result<Machine> {
        let vm = Vm::with_options(ram_size(ram_bytes)?, &[], opts)?;
        Self::assemble(vm, link, Com1::new(NoIrq, Vec::new()))
    }

    fn assemble(vm: Vm, mut link: Box<dyn GpuLink>, serial: Com1) -> Result<Machine> {
        let file: &File = vm.ram_file();
        link.attach_ram(vm.memory(), file)?;
        let msi = EventFd::new(EFD_NONBLOCK).map_err(|e| Error::Device(format!("eventfd: {e}")))?;
        link.set_msi(&msi)?;
        let gpu = GpuPci::new(link)?;
        Ok(Machine {
            vm,
            board: Board {
                serial,
                cf8: 0,
                gpu,
            },
            msi,
            msis: 0,
            exits: 0,
            halted: false,
        })
    }

    /// Runs until the guest halts or `max_exits` more exits have been handled.
    pub fn run(&mut self, max_exits: u64) -> Result<Stop> {
        self.run_until(max_exits, |_| false)
    }

    /// Runs until the guest halts, `max_exits` more exits have been handled, or `stop` (asked
    /// after each exit) says so; `Stop::Budget` in the last two cases.
    pub fn run_until(
        &mut self,
        max_exits: u64,
        mut stop: impl FnMut(&Machine) -> bool,
    ) -> Result<Stop> {
        if self.halted {
            return Ok(Stop::Halted);
        }
        for _ in 0..max_exits {
            let (why, n) = self.vm.run(&mut self.board, 1)?;
            self.exits += n;
            if let Some(e) = self.board.gpu.error.take() {
                return Err(e);
            }
            if why == Stop::Halted {
                self.halted = true;
                self.count_msis();
                return Ok(Stop::Halted);
            }
            if stop(self) {
                break;
            }
        }
        self.count_msis();
        Ok(Stop::Budget)
    }

    fn count_msis(&mut self) {
        if let Ok(n) = self.msi.read() {
            self.msis += n;
        }
    }

    /// Whether the guest program has halted.
    pub fn halted(&self) -> bool {
        self.halted
    }

    /// MSIs the vGPU signalled (the VMM has no interrupt controller to deliver them: the guest
    /// polls; they are counted to show the device raised them).
    pub fn msis(&mut self) -> u64 {
        self.count_msis();
        self.msis
    }

    /// Everything the guest wrote on COM1.
    pub fn serial(&self) -> &[u8] {
        self.board.serial.writer()
    }

    /// The serial output without the lines that hold timing (`tsc …`), which differ between runs.
    pub fn serial_results(&self) -> String {
        String::from_utf8_lossy(self.serial())
            .lines()
            .filter(|l| !l.starts_with("tsc "))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// What the guest recorded about itself.
    pub fn telemetry(&self) -> Result<Telemetry> {
        Telemetry::read(self.vm.memory())
    }

    /// Frames the guest has completed (0 before it starts counting).
    pub fn frames_done(&self) -> u64 {
        self.telemetry().map_or(0, |t| t.frames_done)
    }

    /// A copy of guest RAM with the telemetry page zeroed: what two runs of the same guest must
    /// agree on (the telemetry page holds TSC readings and poll counts, which differ).
    pub fn ram_image(&self) -> Result<Vec<u8>> {
        use vm_memory::{Bytes, GuestAddress};
        let mut out = Vec::new();
        for (start, len) in crate::kvm::ram_layout(self.vm.ram_bytes()) {
            let at = out.len();
            out.resize(at + ram_size(len)?, 0);
            self.vm
                .memory()
                .read_slice(&mut out[at..], GuestAddress(start))
                .map_err(|e| Error::Ram(e.to_string()))?;
        }
        let t = crate::guest::TELEMETRY as usize;
        out[t..t + 4096].fill(0);
        Ok(out)
    }

    /// Whether guest RAM equals `other`'s (a VM of the same size), the telemetry page aside, as
    /// [`Machine::ram_image`] would compare it, without copying RAM: only the pages either
    /// memfd holds data for are read (RAM neither side ever wrote is zero on both, and reading
    /// it would allocate it).
    pub fn ram_equals(&self, other: &Machine) -> Result<bool> {
        use vm_memory::{Bytes, GuestAddress};
        if self.vm.ram_bytes() != other.vm.ram_bytes() {
            return Ok(false);
        }
        let mut extents = self.vm.ram_extents()?;
        extents.extend(other.vm.ram_extents()?);
        extents.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (first, n) in extents {
            match merged.last_mut() {
                Some((f, m)) if first <= *f + *m => *m = (*m).max(first + n - *f),
                _ => merged.push((first, n)),
            }
        }
        const CHUNK: u64 = 256;
        let telemetry = crate::guest::TELEMETRY / 4096;
        let (mut a, mut b) = (
            vec![0u8; CHUNK as usize * 4096],
            vec![0u8; CHUNK as usize * 4096],
        );
        for (first, n) in merged {
            let mut gfn = first;
            while gfn < first + n {
                let k = CHUNK.min(first + n - gfn);
                let len = k as usize * 4096;
                let at = GuestAddress(gfn * 4096);
                let read = |m: &Machine, buf: &mut [u8]| {
                    m.vm.memory()
                        .read_slice(buf, at)
                        .map_err(|e| Error::Ram(e.to_string()))
                };
                read(self, &mut a[..len])?;
                read(other, &mut b[..len])?;
                if (gfn..gfn + k).contains(&telemetry) {
                    let t = (telemetry - gfn) as usize * 4096;
                    a[t..t + 4096].fill(0);
                    b[t..t + 4096].fill(0);
                }
                if a[..len] != b[..len] {
                    return Ok(false);
                }
                gfn += k;
            }
        }
        Ok(true)
    }

    /// The KVM side.
    pub fn vm(&self) -> &Vm {
        &self.vm
    }

    /// The vGPU on the bus.
    pub fn gpu(&mut self) -> &mut GpuPci {
        &mut self.board.gpu
    }

    /// The KVM side and the vGPU at once (the vGPU to be driven from another thread).
    pub fn split(&mut self) -> (&Vm, &mut GpuPci) {
        (&self.vm, &mut self.board.gpu)
    }

    /// The vGPU on the bus, shared.
    pub fn gpu_ref(&self) -> &GpuPci {
        &self.board.gpu
    }

    /// COM1's state and output.
    pub fn save_serial(&self) -> SerialSnapshot {
        let s = self.board.serial.state();
        SerialSnapshot {
            regs: [
                s.baud_divisor_low,
                s.baud_divisor_high,
                s.interrupt_enable,
                s.interrupt_identification,
                s.line_control,
                s.line_status,
                s.modem_control,
                s.modem_status,
                s.scratch,
            ],
            in_buffer: s.in_buffer,
            output: self.serial().to_vec(),
        }
    }

    /// Loads a migrated COM1.
    pub fn restore_serial(&mut self, s: &SerialSnapshot) -> Result<()> {
        let r = s.regs;
        let state = SerialState {
            baud_divisor_low: r[0],
            baud_divisor_high: r[1],
            interrupt_enable: r[2],
            interrupt_identification: r[3],
            line_control: r[4],
            line_status: r[5],
            modem_control: r[6],
            modem_status: r[7],
            scratch: r[8],
            in_buffer: s.in_buffer.clone(),
        };
        self.board.serial = Com1::from_state(&state, NoIrq, NoEvents, s.output.clone())
            .map_err(|e| Error::Guest(format!("serial state: {e:?}")))?;
        Ok(())
    }
}

fn ram_size(bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| Error::Ram(format!("{bytes} bytes of RAM")))
}
