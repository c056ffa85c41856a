//! PCI configuration mechanism 1 (ports 0xCF8/0xCFC) and the VMM's device trait.

/// A PCI device as the VMM sees it: configuration space, BAR accesses and guest RAM.
/// The vGPU implements it in-process; a vfio-user client can implement it later.
pub trait PciDevice: Send {
    /// Reads the 32-bit configuration register at `offset` (dword aligned).
    fn config_read(&mut self, offset: u16) -> u32;
    /// Writes the 32-bit configuration register at `offset` (dword aligned).
    fn config_write(&mut self, offset: u16, value: u32);
    /// Reads `data.len()` bytes at `offset` within BAR `bar`.
    fn bar_read(&mut self, bar: u8, offset: u64, data: &mut [u8]);
    /// Writes `data` at `offset` within BAR `bar`.
    fn bar_write(&mut self, bar: u8, offset: u64, data: &[u8]);
}

/// Configuration address port.
pub const CONFIG_ADDRESS: u16 = 0xcf8;
/// Configuration data port (0xCFC..=0xCFF).
pub const CONFIG_DATA: u16 = 0xcfc;

/// A host bridge with one bus; device `n` sits at 00:n.0.
#[derive(Default)]
pub struct PciHost {
    address: u32,
    devices: Vec<Box<dyn PciDevice>>,
}

impl PciHost {
    /// Adds a device at the next slot and returns its slot number.
    pub fn add(&mut self, dev: Box<dyn PciDevice>) -> u8 {
        self.devices.push(dev);
        (self.devices.len() - 1) as u8
    }

    /// The device at `slot`, if any.
    pub fn device(&mut self, slot: u8) -> Option<&mut (dyn PciDevice + 'static)> {
        self.devices.get_mut(slot as usize).map(AsMut::as_mut)
    }

    fn target(&self) -> Option<(usize, u16)> {
        let a = self.address;
        let (bus, dev, func) = ((a >> 16) & 0xff, (a >> 11) & 0x1f, (a >> 8) & 7);
        if a & 0x8000_0000 == 0 || bus != 0 || func != 0 || dev as usize >= self.devices.len() {
            return None;
        }
        Some((dev as usize, (a & 0xfc) as u16))
    }

    /// Handles a port read; returns false if the port is not ours.
    pub fn pio_read(&mut self, port: u16, data: &mut [u8]) -> bool {
        if port == CONFIG_ADDRESS && data.len() == 4 {
            data.copy_from_slice(&self.address.to_le_bytes());
            return true;
        }
        if !(CONFIG_DATA..CONFIG_DATA + 4).contains(&port) {
            return false;
        }
        let v = match self.target() {
            Some((d, off)) => self.devices[d].config_read(off),
            None => 0xffff_ffff,
        };
        let shift = (port - CONFIG_DATA) as usize;
        let bytes = v.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = *bytes.get(shift + i).unwrap_or(&0xff);
        }
        true
    }

    /// Handles a port write; returns false if the port is not ours.
    pub fn pio_write(&mut self, port: u16, data: &[u8]) -> bool {
        if port == CONFIG_ADDRESS && data.len() == 4 {
            self.address = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            return true;
        }
        if !(CONFIG_DATA..CONFIG_DATA + 4).contains(&port) {
            return false;
        }
        if let Some((d, off)) = self.target() {
            let shift = (port - CONFIG_DATA) as usize;
            let mut bytes = self.devices[d].config_read(off).to_le_bytes();
            for (i, b) in data.iter().enumerate() {
                if let Some(slot) = bytes.get_mut(shift + i) {
                    *slot = *b;
                }
            }
            self.devices[d].config_write(off, u32::from_le_bytes(bytes));
        }
        true
    }
}
