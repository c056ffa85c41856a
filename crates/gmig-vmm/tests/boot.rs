//! The VMM boots a 64-bit guest that scans PCI config space, touches a BAR and prints on COM1.

use gmig_vmm::{Bus, PciDevice, PciHost, Stop, Vm};
use std::sync::{Arc, Mutex};

fn kvm_present() -> bool {
    if std::path::Path::new("/dev/kvm").exists() {
        return true;
    }
    eprintln!("SKIPPED: /dev/kvm is absent");
    false
}

struct Fake {
    writes: Arc<Mutex<Vec<(u8, u64, u32)>>>,
}

impl PciDevice for Fake {
    fn config_read(&mut self, offset: u16) -> u32 {
        match offset {
            0 => 0x1912_8086, // Intel, GVT-g-like device id
            0x10 => 0xc000_0000,
            _ => 0,
        }
    }
    fn config_write(&mut self, _offset: u16, _value: u32) {}
    fn bar_read(&mut self, _bar: u8, offset: u64, data: &mut [u8]) {
        let v = (offset as u32) ^ 0x5a5a_0000;
        data.copy_from_slice(&v.to_le_bytes()[..data.len()]);
    }
    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]) {
        let mut b = [0u8; 4];
        b[..data.len().min(4)].copy_from_slice(&data[..data.len().min(4)]);
        self.writes
            .lock()
            .unwrap()
            .push((bar, offset, u32::from_le_bytes(b)));
    }
}

/// A bus with the PCI host, COM1 output and one BAR window at 3 GiB for slot 0's BAR0.
struct TestBus {
    pci: PciHost,
    serial: Vec<u8>,
}

const BAR: u64 = 0xc000_0000;

impl Bus for TestBus {
    fn pio_read(&mut self, port: u16, data: &mut [u8]) {
        if !self.pci.pio_read(port, data) {
            data.fill(0xff);
        }
    }
    fn pio_write(&mut self, port: u16, data: &[u8]) {
        if port == 0x3f8 {
            self.serial.extend_from_slice(data);
        } else {
            self.pci.pio_write(port, data);
        }
    }
    fn mmio_read(&mut self, addr: u64, data: &mut [u8]) {
        match (addr.checked_sub(BAR), self.pci.device(0)) {
            (Some(off), Some(d)) if off < 16 << 20 => d.bar_read(0, off, data),
            _ => data.fill(0xff),
        }
    }
    fn mmio_write(&mut self, addr: u64, data: &[u8]) {
        if let (Some(off), Some(d)) = (addr.checked_sub(BAR), self.pci.device(0)) {
            if off < 16 << 20 {
                d.bar_write(0, off, data);
            }
        }
    }
}

#[test]
fn guest_reads_pci_config_writes_bar_and_prints() {
    if !kvm_present() {
        return;
    }
    #[rustfmt::skip]
    let prog: Vec<u8> = vec![
        0x66, 0xba, 0xf8, 0x0c,             // mov dx, 0xcf8
        0xb8, 0x00, 0x00, 0x00, 0x80,       // mov eax, 0x80000000 (00:00.0, reg 0)
        0xef,                               // out dx, eax
        0x66, 0xba, 0xfc, 0x0c,             // mov dx, 0xcfc
        0xed,                               // in eax, dx  -> vendor/device
        0x89, 0xc3,                         // mov ebx, eax
        0xb9, 0x00, 0x00, 0x00, 0xc0,       // mov ecx, 0xc0000000 (BAR0)
        0x89, 0x59, 0x10,                   // mov [rcx+0x10], ebx
        0x8b, 0x41, 0x20,                   // mov eax, [rcx+0x20]
        0x89, 0x41, 0x24,                   // mov [rcx+0x24], eax
        0x66, 0xba, 0xf8, 0x03,             // mov dx, 0x3f8
        0xb0, b'O', 0xee,                   // out 'O'
        0xb0, b'K', 0xee,                   // out 'K'
        0xb0, b'\n', 0xee,                  // out '\n'
        0xf4,                               // hlt
    ];
    let mut vm = Vm::new(64 << 20, &prog).expect("VM");
    let writes = Arc::new(Mutex::new(Vec::new()));
    let mut bus = TestBus {
        pci: PciHost::default(),
        serial: Vec::new(),
    };
    bus.pci.add(Box::new(Fake {
        writes: writes.clone(),
    }));
    assert_eq!(vm.run(&mut bus, 1000).expect("run").0, Stop::Halted);
    assert_eq!(bus.serial, b"OK\n");
    let w = writes.lock().unwrap();
    assert_eq!(*w, vec![(0, 0x10, 0x1912_8086), (0, 0x24, 0x5a5a_0020)]);
}
