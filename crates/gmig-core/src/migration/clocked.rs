//! A guest on its own clock: [`ClockedVm`] runs a VM's guest on a thread of its own, at a frame
//! rate or as fast as it goes, while the engine migrates it.
//!
//! With [`MigrationConfig::step_every_batches`](super::MigrationConfig::step_every_batches) the
//! engine itself runs the guest one step after every N pre-copy batches: exactly reproducible,
//! but the guest draws only while the engine sends, and stops drawing when the engine stops
//! sending (a verification before the stop then finds the quiet the migration made). A real
//! guest draws on its own clock; this wrapper gives it one.
//!
//! **Sharing the VM.** The VM sits behind a mutex. The guest thread takes it for one step (a
//! frame's submission) or for one piece of the device's work
//! ([`MigratableVm::run_device_piece`]), and lets go in between; every [`MigratableVm`] call the
//! engine makes takes it too, and the guest thread yields to a waiting engine call before it
//! takes the lock again. Guest memory is read without the lock, as a VMM's pre-copy reads RAM a
//! running vCPU writes: a page the guest writes while it is copied has its hash taken over the
//! copy, so it shows as changed at the next re-hash.
//!
//! **Dirty tracking.** Every write the guest and the device make happens under the lock, and the
//! candidate set is read and restarted under it in one step
//! ([`MigratableVm::restart_write_tracking`]), so a write lands in exactly one set.
//!
//! **The stop.** [`MigratableVm::quiesce`] pauses the clock under the lock before it quiesces the
//! VM, as a VMM stops its vCPUs before the device: no step runs after it, and the frame count at
//! the stop is fixed. [`MigratableVm::unquiesce`] (a migration that failed) starts it again.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vm_memory::GuestMemoryMmap;

use super::vm::{Candidates, Drain, DrainWrites, MigratableVm, VmError};
use crate::stream::{Gfn, StateKind, StreamHeader};

struct State<V> {
    vm: V,
    /// Quiesced: the guest does not run.
    paused: bool,
    /// The guest thread is to end.
    exit: bool,
    /// Why the guest thread stopped, if a step failed.
    error: Option<VmError>,
}

struct Shared<V> {
    state: Mutex<State<V>>,
    wake: Condvar,
    /// Engine calls waiting for the lock: the guest thread lets them in first.
    waiting: AtomicUsize,
    frames: Arc<AtomicU64>,
}

impl<V> Shared<V> {
    /// The lock, for a caller other than the guest thread (the guest thread yields to it).
    fn lock(&self) -> MutexGuard<'_, State<V>> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let g = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        g
    }
}

/// The steps (frames) a [`ClockedVm`]'s guest has run, readable from anywhere while the engine
/// holds the VM.
#[derive(Debug, Clone)]
pub struct FrameCounter(Arc<AtomicU64>);

impl FrameCounter {
    /// Steps run so far (by the clock, and through [`MigratableVm::step`]).
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A VM whose guest runs on its own thread: one step every `interval` (a frame rate), or one
/// after another when `interval` is `None`, with the device's queued work run in pieces in
/// between. The engine migrates it like any [`MigratableVm`] (give it `step_every_batches = 0`).
pub struct ClockedVm<V: MigratableVm + 'static> {
    shared: Arc<Shared<V>>,
    mem: GuestMemoryMmap,
    interval: Option<Duration>,
    thread: Option<JoinHandle<()>>,
}

impl<V: MigratableVm + 'static> std::fmt::Debug for ClockedVm<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClockedVm")
            .field("interval", &self.interval)
            .field("frames", &self.shared.frames.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl<V: MigratableVm + 'static> ClockedVm<V> {
    /// Start `vm`'s guest on its own thread: a step every `interval`, or back to back (`None`).
    /// A step that falls behind its time is not made up for: the next one is due an interval
    /// after it.
    ///
    /// # Errors
    /// The thread could not be started.
    pub fn start(vm: V, interval: Option<Duration>) -> Result<Self, VmError> {
        let mut me = Self::stepped(vm);
        me.interval = interval;
        let s = Arc::clone(&me.shared);
        let thread = std::thread::Builder::new()
            .name("gmig-guest".into())
            .spawn(move || guest_loop(&s, interval))
            .map_err(|e| VmError(format!("starting the guest's thread: {e}")))?;
        me.thread = Some(thread);
        Ok(me)
    }

    /// `vm` with no clock: its guest runs only when [`MigratableVm::step`] is called (the
    /// engine's batch-stepped mode), and the step count is kept as for a clocked one.
    pub fn stepped(vm: V) -> Self {
        let mem = vm.memory().clone();
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    vm,
                    paused: false,
                    exit: false,
                    error: None,
                }),
                wake: Condvar::new(),
                waiting: AtomicUsize::new(0),
                frames: Arc::new(AtomicU64::new(0)),
            }),
            mem,
            interval: None,
            thread: None,
        }
    }

    /// Steps the guest has run since [`ClockedVm::start`].
    pub fn frames(&self) -> u64 {
        self.shared.frames.load(Ordering::SeqCst)
    }

    /// A handle on the step count, to read while the engine holds this VM.
    pub fn frame_counter(&self) -> FrameCounter {
        FrameCounter(Arc::clone(&self.shared.frames))
    }

    /// The step interval (`None`: back to back).
    pub fn interval(&self) -> Option<Duration> {
        self.interval
    }

    /// Runs `f` on the VM with the guest held between two of its pieces of work.
    pub fn with_vm<R>(&self, f: impl FnOnce(&mut V) -> R) -> R {
        f(&mut self.shared.lock().vm)
    }

    /// Stops the guest's thread and gives the VM back.
    ///
    /// # Errors
    /// A step of the guest failed (the error it gave).
    pub fn stop(mut self) -> Result<V, VmError> {
        self.end_thread();
        let shared = Arc::clone(&self.shared);
        drop(self);
        let state = Arc::try_unwrap(shared)
            .map_err(|_| VmError("the guest's VM is still shared".into()))?
            .state
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        match state.error {
            Some(e) => Err(e),
            None => Ok(state.vm),
        }
    }

    fn end_thread(&mut self) {
        self.shared.lock().exit = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            // A panicking guest thread leaves the VM as it was; its error is the panic's.
            if t.join().is_err() {
                let mut g = self.shared.lock();
                g.error
                    .get_or_insert(VmError("the guest's thread panicked".into()));
            }
        }
    }

    fn guest_error(&self) -> Result<(), VmError> {
        match &self.shared.lock().error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

impl<V: MigratableVm + 'static> Drop for ClockedVm<V> {
    fn drop(&mut self) {
        self.end_thread();
    }
}

fn guest_loop<V: MigratableVm>(shared: &Shared<V>, interval: Option<Duration>) {
    let mut next = Instant::now();
    let mut g = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if g.exit || g.error.is_some() {
            return;
        }
        if g.paused {
            g = shared.wake.wait(g).unwrap_or_else(PoisonError::into_inner);
            next = Instant::now();
            continue;
        }
        // The device works through what was submitted (a GPU runs while the guest waits for
        // its next frame), one piece at a time.
        let worked = match g.vm.run_device_piece() {
            Ok(more) => more,
            Err(e) => {
                g.error = Some(e);
                return;
            }
        };
        if !worked {
            let now = Instant::now();
            if interval.is_some() && now < next {
                g = shared
                    .wake
                    .wait_timeout(g, next - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
            if let Err(e) = g.vm.step() {
                g.error = Some(e);
                return;
            }
            shared.frames.fetch_add(1, Ordering::SeqCst);
            if let Some(iv) = interval {
                // A late frame is not made up for.
                next = (next + iv).max(now);
            }
        }
        drop(g);
        while shared.waiting.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        g = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
    }
}

impl<V: MigratableVm + 'static> MigratableVm for ClockedVm<V> {
    fn stream_header(&self) -> StreamHeader {
        self.shared.lock().vm.stream_header()
    }

    fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    fn migratable_pages(&self) -> Vec<Gfn> {
        self.shared.lock().vm.migratable_pages()
    }

    fn migratable_pages_fixed(&self) -> bool {
        self.shared.lock().vm.migratable_pages_fixed()
    }

    fn step(&mut self) -> Result<(), VmError> {
        self.shared.lock().vm.step()?;
        self.shared.frames.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn run_device_piece(&mut self) -> Result<bool, VmError> {
        self.shared.lock().vm.run_device_piece()
    }

    fn start_write_tracking(&mut self) {
        self.shared.lock().vm.start_write_tracking();
    }

    fn stop_write_tracking(&mut self) {
        self.shared.lock().vm.stop_write_tracking();
    }

    fn write_candidates(&mut self) -> Candidates {
        self.shared.lock().vm.write_candidates()
    }

    fn restart_write_tracking(&mut self) -> Candidates {
        // Under one lock: no step of the guest lands between reading the set and restarting it.
        self.shared.lock().vm.restart_write_tracking()
    }

    fn quiesce(&mut self, drain: Drain) -> Result<usize, VmError> {
        self.guest_error()?;
        let mut g = self.shared.lock();
        // The vCPUs first: no step runs once the lock is let go.
        g.paused = true;
        g.vm.quiesce(drain)
    }

    fn drain_writes(&self, max_drain: usize) -> Option<DrainWrites> {
        self.shared.lock().vm.drain_writes(max_drain)
    }

    fn device_writable_pages(&self) -> Option<Vec<Gfn>> {
        self.shared.lock().vm.device_writable_pages()
    }

    fn unquiesce(&mut self) -> Result<(), VmError> {
        let mut g = self.shared.lock();
        g.vm.unquiesce()?;
        g.paused = false;
        drop(g);
        self.shared.wake.notify_all();
        Ok(())
    }

    fn save_state(&self) -> Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        self.shared.lock().vm.save_state()
    }

    fn precopy_state(&mut self) -> Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        self.shared.lock().vm.precopy_state()
    }

    fn save_state_delta(&self) -> Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        self.shared.lock().vm.save_state_delta()
    }
}
