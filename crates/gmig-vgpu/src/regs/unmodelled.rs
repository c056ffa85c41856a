//! Registers the guest touched that no register row models (counted, logged once).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Registers the guest touched that no row models: offset to accesses. Counted on reads too,
/// which take `&Vgpu`, hence the lock; not migrated (it describes this host's run).
#[derive(Default)]
pub(crate) struct Unmodelled(Mutex<BTreeMap<u32, u64>>);

impl Unmodelled {
    pub(crate) fn note(&self, offset: u32, write: bool) {
        let mut m = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = m.entry(offset).or_insert(0);
        *n += 1;
        if *n == 1 {
            tracing::debug!(
                offset = format_args!("{offset:#x}"),
                write,
                "unmodelled register (plain store)"
            );
        }
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<u32, u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Clone for Unmodelled {
    fn clone(&self) -> Self {
        Unmodelled(Mutex::new(self.snapshot()))
    }
}

impl std::fmt::Debug for Unmodelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Unmodelled({} registers)", self.snapshot().len())
    }
}
