//! KVM's dirty log, read one of two ways.
//!
//! * **GET** (`KVM_GET_DIRTY_LOG` alone): each read returns a slot's whole log and, in the same
//!   call, clears it and write-protects every page it reported again. The kernel walks the whole
//!   bitmap, word by word, under the MMU lock.
//! * **Manual protect** (`KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`): `KVM_GET_DIRTY_LOG` only copies the
//!   slot's log out; `KVM_CLEAR_DIRTY_LOG` clears the bits the VMM names and write-protects those
//!   pages again. A pre-copy round reads the log, clears exactly the pages it read (before the
//!   copier reads them: a write after the clear is logged again) and nothing else; the stop reads
//!   the log and clears nothing (the source's vCPU does not run again; a migration that rolls back
//!   re-arms the whole log when the next one starts). With `KVM_DIRTY_LOG_INITIALLY_SET` every
//!   page starts dirty and KVM write-protects nothing until the VMM clears it: the first clear
//!   (when a migration starts, over all of guest RAM) arms the log, and the first pass sends the
//!   RAM that holds data.
//!
//! A bit is only ever cleared by a clear that names it, which write-protects the page in the same
//! call, so skipping a clear can only make the log report more, never lose a write; clearing a
//! page the VMM did not read loses it.

use kvm_bindings::{
    kvm_clear_dirty_log, kvm_enable_cap, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
    KVM_DIRTY_LOG_INITIALLY_SET, KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iowr_nr;

use crate::{Error, Result};

ioctl_iowr_nr!(KVM_CLEAR_DIRTY_LOG, 0xAE, 0xc0, kvm_clear_dirty_log);

/// How this VM's dirty log is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DirtyLogMode {
    /// `KVM_GET_DIRTY_LOG` reads and clears at once (the kernel lacks manual protect, or it was
    /// not asked for).
    #[default]
    Get,
    /// `KVM_CLEAR_DIRTY_LOG` with manual protect; pages start clean and write-protected.
    ManualProtect,
    /// Manual protect with `KVM_DIRTY_LOG_INITIALLY_SET`: pages start dirty and writable.
    #[serde(rename = "manual-protect+initially-set")]
    ManualProtectInitiallySet,
}

impl DirtyLogMode {
    /// The mode's name, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            DirtyLogMode::Get => "get",
            DirtyLogMode::ManualProtect => "manual-protect",
            DirtyLogMode::ManualProtectInitiallySet => "manual-protect+initially-set",
        }
    }

    /// Whether `KVM_CLEAR_DIRTY_LOG` is in use.
    pub fn manual(self) -> bool {
        self != DirtyLogMode::Get
    }
}

/// Which dirty-log mode a VM asks KVM for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyLogWant {
    /// Manual protect, with initially-set, where KVM offers them; GET otherwise.
    #[default]
    Auto,
    /// Manual protect without initially-set where offered; GET otherwise.
    ManualProtect,
    /// GET, even where KVM offers manual protect.
    Get,
}

/// What `vm`'s KVM offers of manual protect: the `KVM_DIRTY_LOG_*` flags it accepts (0: none).
pub fn manual_protect_flags(vm: &VmFd) -> u64 {
    let r = vm.check_extension_raw(u64::from(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2));
    u64::try_from(r).unwrap_or(0)
}

/// Turns on the mode `want` asks for, as far as `vm`'s KVM offers it. Must come before the memory
/// slots are made (initially-set applies to the bitmaps a slot gets when it is made).
pub fn enable(vm: &VmFd, want: DirtyLogWant) -> Result<DirtyLogMode> {
    let offered = manual_protect_flags(vm);
    let manual = u64::from(KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE);
    let init = u64::from(KVM_DIRTY_LOG_INITIALLY_SET);
    if want == DirtyLogWant::Get || offered & manual == 0 {
        return Ok(DirtyLogMode::Get);
    }
    let initially_set = want == DirtyLogWant::Auto && offered & init != 0;
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
        ..Default::default()
    };
    cap.args[0] = manual | if initially_set { init } else { 0 };
    vm.enable_cap(&cap)
        .map_err(crate::kvm("KVM_ENABLE_CAP(MANUAL_DIRTY_LOG_PROTECT2)"))?;
    Ok(if initially_set {
        DirtyLogMode::ManualProtectInitiallySet
    } else {
        DirtyLogMode::ManualProtect
    })
}

/// `KVM_CLEAR_DIRTY_LOG`: clears the bits set in `words` (bit `n` = page `first_page + n` of
/// `slot`, whose log covers `slot_pages` pages) and write-protects those pages again. Only the
/// span from the first to the last non-zero word goes to the kernel; nothing when all are zero.
pub fn clear(vm: &VmFd, slot: u32, slot_pages: u64, words: &[u64]) -> Result<()> {
    let Some(first) = words.iter().position(|&w| w != 0) else {
        return Ok(());
    };
    let last = words.iter().rposition(|&w| w != 0).unwrap_or(first);
    let span = &words[first..=last];
    let first_page = first as u64 * 64;
    // A span ends on a multiple of 64 pages unless it ends the slot (KVM's rule).
    let num_pages = (span.len() as u64 * 64).min(slot_pages.saturating_sub(first_page));
    let (Ok(num), true) = (u32::try_from(num_pages), num_pages > 0) else {
        return Err(Error::Ram(format!(
            "dirty-log clear of {num_pages} pages at page {first_page} of a {slot_pages}-page slot"
        )));
    };
    let mut arg = kvm_clear_dirty_log {
        slot,
        num_pages: num,
        first_page,
        ..Default::default()
    };
    arg.__bindgen_anon_1.dirty_bitmap = span.as_ptr().cast_mut().cast();
    // SAFETY: `arg` is a whole `kvm_clear_dirty_log` for the VM fd `vm`; its bitmap points at
    // `span`, which holds `span.len() * 64 >= num_pages` bits and outlives the call; the kernel
    // only reads the bitmap (it clears its own copy of the log, not ours).
    let r = unsafe { ioctl_with_ref(vm, KVM_CLEAR_DIRTY_LOG(), &arg) };
    if r != 0 {
        return Err(Error::Kvm {
            what: "KVM_CLEAR_DIRTY_LOG",
            source: kvm_ioctls::Error::last(),
        });
    }
    Ok(())
}
