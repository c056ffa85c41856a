//! The vGPU's interrupts as `vfio-pci` presents a PCI function's: INTx (index 0: one vector,
//! eventfd, maskable, automasked — the configuration space advertises INTA#, as an Intel iGPU's
//! does, and QEMU enables INTx at realize whenever a pin is set) and MSI (index 1: one vector,
//! eventfd). SET_IRQS arrives here checked by the server ([`crate::server`]), booleans already
//! turned into one DATA_NONE request per vector.
//!
//! INTx follows the kernel's automasking: an interrupt signals the trigger eventfd and masks the
//! line; one raised while masked waits, and is signalled when the client unmasks (QEMU unmasks at
//! the guest's EOI). Mask and unmask eventfds (KVM's resample path) are not offered: QEMU then
//! keeps unmasking by message.

use std::fs::File;
use std::io::Write;

use vfio_bindings::bindings::vfio as uapi;

use crate::proto::Errno;

/// IRQ index of INTx.
pub(crate) const INTX: u32 = 0;
/// IRQ index of MSI.
pub(crate) const MSI: u32 = 1;

/// The interrupt state the client set up.
#[derive(Debug, Default)]
pub(crate) struct Irqs {
    msi: Option<File>,
    intx: Option<File>,
    intx_masked: bool,
    intx_pending: bool,
}

fn signal(f: &mut File) {
    let _ = f.write_all(&1u64.to_le_bytes());
}

impl Irqs {
    /// `(flags, count)` of IRQ index `index`, as GET_IRQ_INFO answers; `None` when absent.
    pub(crate) fn info(index: u32) -> Option<(u32, u32)> {
        match index {
            INTX => Some((
                uapi::VFIO_IRQ_INFO_EVENTFD
                    | uapi::VFIO_IRQ_INFO_MASKABLE
                    | uapi::VFIO_IRQ_INFO_AUTOMASKED,
                1,
            )),
            MSI => Some((uapi::VFIO_IRQ_INFO_EVENTFD, 1)),
            _ => None,
        }
    }

    /// SET_IRQS on `index` (vectors `start..start+count` already checked against
    /// [`Irqs::info`]). `flags` must name a data type and an action, as the kernel's
    /// `vfio_set_irqs_validate_and_prepare` requires (in-process callers included).
    pub(crate) fn set(
        &mut self,
        index: u32,
        flags: u32,
        count: u32,
        fds: Vec<File>,
    ) -> Result<(), Errno> {
        use uapi::{
            VFIO_IRQ_SET_ACTION_MASK as MASK, VFIO_IRQ_SET_ACTION_TRIGGER as TRIGGER,
            VFIO_IRQ_SET_ACTION_UNMASK as UNMASK, VFIO_IRQ_SET_DATA_EVENTFD as EVENTFD,
            VFIO_IRQ_SET_DATA_NONE as NONE,
        };
        let eventfd = flags & EVENTFD != 0;
        let action = flags & uapi::VFIO_IRQ_SET_ACTION_TYPE_MASK;
        match (index, action) {
            (MSI, TRIGGER) if eventfd => self.msi = fds.into_iter().next(),
            (MSI, TRIGGER) if count == 0 => self.msi = None,
            (MSI, TRIGGER) => {
                if let Some(f) = self.msi.as_mut() {
                    signal(f);
                }
            }
            (INTX, TRIGGER) if eventfd || count == 0 => {
                self.intx = fds.into_iter().next();
                self.intx_masked = false;
                self.intx_pending = false;
            }
            (INTX, TRIGGER) => self.assert_intx(),
            (INTX, MASK) if flags & NONE != 0 => self.intx_masked = true,
            (INTX, UNMASK) if flags & NONE != 0 => {
                self.intx_masked = false;
                if std::mem::take(&mut self.intx_pending) {
                    self.assert_intx();
                }
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(())
    }

    /// The device raised an interrupt: MSI while the client has armed it (an MSI trigger
    /// eventfd set by SET_IRQS), else INTx unless the guest disabled it in the command register.
    ///
    /// As with kernel vfio-pci, SET_IRQS is what enables MSI, not the capability's enable bit in
    /// the function's configuration space: QEMU emulates that capability and arms MSI when the
    /// guest enables it. A migration destination shows why it matters: QEMU restores the
    /// capability in its own copy of configuration space and arms MSI, but never writes the
    /// enable bit to the device.
    pub(crate) fn raise(&mut self, intx_enabled: bool) {
        if let Some(f) = self.msi.as_mut() {
            signal(f);
        } else if intx_enabled {
            self.assert_intx();
        }
    }

    fn assert_intx(&mut self) {
        let Some(f) = self.intx.as_mut() else {
            return;
        };
        if self.intx_masked {
            self.intx_pending = true;
        } else {
            signal(f);
            self.intx_masked = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_irqs_without_a_data_type_and_action_is_refused() {
        let mut irqs = Irqs::default();
        let fd = || tempfile::tempfile().unwrap();
        assert_eq!(irqs.set(MSI, 0, 1, vec![fd()]), Err(libc::EINVAL));
        assert!(irqs.msi.is_none());
        let eventfd_trigger = uapi::VFIO_IRQ_SET_DATA_EVENTFD | uapi::VFIO_IRQ_SET_ACTION_TRIGGER;
        assert_eq!(irqs.set(MSI, eventfd_trigger, 1, vec![fd()]), Ok(()));
        assert!(irqs.msi.is_some());
    }
}
