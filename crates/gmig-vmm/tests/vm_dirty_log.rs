//! KVM's dirty log read with manual protect (`KVM_CLEAR_DIRTY_LOG`) and with plain
//! `KVM_GET_DIRTY_LOG`, each in a whole-VM migration whose destination, run on after the
//! switch-over, must finish exactly as an unmigrated run.
//!
//! Negative controls of manual protect: a migration that clears the log before reading it drops
//! the pages the guest wrote since the last read, and its destination differs; one that never
//! clears what it read keeps every page written since the migration started dirty (KVM clears a
//! bit only where the VMM asks, and re-protects the page in the same call), so its stop sends
//! more pages than the correct one, with the same result. A KVM without manual protect skips the
//! manual-protect test, saying so; the GET path is tested everywhere, against its own control
//! (KVM's log alone, without the vGPU's, differs).

mod common;

use common::*;
use gmig_vmm::migrate::{migrate_in, Options, Report};
use gmig_vmm::{DirtyLogMode, DirtyLogWant, GuestConfig, GuestProfile, Machine, Stop, VmOptions};

fn cfg() -> GuestConfig {
    GuestConfig {
        profile: GuestProfile::Desktop,
        frames: FRAMES,
        ..GuestConfig::default()
    }
}

fn point(c: &GuestConfig) -> Point {
    Point::Frame(u64::from(c.frames) / 3, 3)
}

/// Migrates a source made with `vm` and returns the source's report and whether the destination,
/// run on, finished exactly as `base` (after checking that it worked after the switch-over).
fn migrate(what: &str, base: &Machine, vm: DirtyLogWant, opts: &Options) -> (Report, bool) {
    let c = cfg();
    let vm = VmOptions {
        dirty_log: vm,
        ..VmOptions::default()
    };
    let src = Machine::boot_with(RAM, &c, linked(0, true), &vm).expect("boot");
    let (_src, dest, rep) = migrate_machine_at(src, &c, point(&c), opts, move |s| {
        migrate_in(s, linked(1, true))
    });
    let rep = rep.unwrap_or_else(|e| panic!("{what}: migration failed: {e}"));
    let (mut m, inc) = dest.unwrap_or_else(|e| panic!("{what}: destination failed: {e}"));
    // A guest whose pages were lost may wait for ever: a hang is a difference too.
    let halted = matches!(m.run(base.exits * 3), Ok(Stop::Halted));
    let same_ram = differing_pages(&ram(base), &ram(&m)).is_empty();
    // The bench's RAM comparison (extents only, no copy) agrees with the full one.
    assert_eq!(m.ram_equals(base).expect("compare"), same_ram, "{what}");
    let same = halted && m.serial_results() == base.serial_results() && same_ram;
    if same {
        assert_destination_worked(what, &rep, &inc, &m, None);
    }
    eprintln!(
        "{what}: mode {}, {} rounds, {} pages pre-copy, {} in the stop, dirty log {:.3} ms (KVM {:.3}); finished as the unmigrated run: {same}",
        rep.dirty_log_mode.name(),
        rep.rounds,
        rep.precopy_pages,
        rep.final_pages,
        rep.dirty_log_ms,
        rep.kvm_log_ms
    );
    (rep, same)
}

#[test]
fn manual_protect_migrates_exactly_and_its_controls_fail() {
    if !kvm_present() {
        return;
    }
    let probe = Machine::boot(RAM, &cfg(), linked(0, true)).expect("boot");
    let flags = gmig_vmm::kvm::manual_protect_flags(probe.vm().vm_fd());
    if !probe.vm().dirty_log_mode().manual() {
        eprintln!(
            "SKIPPED: this KVM does not offer KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 (flags {flags:#x}): \
             no KVM_CLEAR_DIRTY_LOG to test; the GET fallback is tested by \
             get_fallback_migrates_exactly_and_reports_it"
        );
        return;
    }
    eprintln!("KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 offers flags {flags:#x}");
    drop(probe);
    let base = baseline(&cfg());
    let o = opts();
    let mut correct = Vec::new();
    for (want, mode) in [
        (DirtyLogWant::Auto, DirtyLogMode::ManualProtectInitiallySet),
        (DirtyLogWant::ManualProtect, DirtyLogMode::ManualProtect),
    ] {
        if mode == DirtyLogMode::ManualProtectInitiallySet && flags & 2 == 0 {
            eprintln!("initially-set not offered here: Auto runs manual protect alone");
            continue;
        }
        let what = mode.name();
        let (rep, same) = migrate(what, &base, want, &o);
        assert_eq!(rep.dirty_log_mode, mode, "{what}");
        assert!(
            same,
            "{what}: the destination differs from the unmigrated run"
        );
        assert!(
            rep.rounds > 2,
            "{what}: too few rounds to re-arm the log: {rep:?}"
        );
        correct.push((what, rep));
    }

    // Control: the log cleared before each read drops what the guest wrote since the last one.
    let drop_unread = Options {
        x_drop_unread: true,
        ..o
    };
    let (_, same) = migrate(
        "control: clear before read",
        &base,
        DirtyLogWant::Auto,
        &drop_unread,
    );
    assert!(
        !same,
        "clearing the log before reading it lost nothing: KVM_CLEAR_DIRTY_LOG did not clear"
    );

    // Control: what was read is never cleared, so it stays dirty to the end.
    let skip = Options {
        x_skip_clear: true,
        ..o
    };
    for (what, rep) in &correct {
        let want = if rep.dirty_log_mode == DirtyLogMode::ManualProtect {
            DirtyLogWant::ManualProtect
        } else {
            DirtyLogWant::Auto
        };
        let ctl = format!("control: {what}, never cleared");
        let (skipped, same) = migrate(&ctl, &base, want, &skip);
        assert!(same, "{ctl}: a log never cleared still loses no write");
        assert!(
            skipped.final_pages > rep.final_pages,
            "{ctl}: the stop sent {} pages, no more than the correct migration's {}: the clears \
             of the pre-copy rounds did not re-arm the log",
            skipped.final_pages,
            rep.final_pages
        );
    }
}

#[test]
fn get_fallback_migrates_exactly_and_reports_it() {
    if !kvm_present() {
        return;
    }
    let base = baseline(&cfg());
    let (rep, same) = migrate("get", &base, DirtyLogWant::Get, &opts());
    assert_eq!(rep.dirty_log_mode, DirtyLogMode::Get);
    assert!(same, "GET: the destination differs from the unmigrated run");
    assert!(rep.rounds > 2, "GET: too few rounds: {rep:?}");
    // Control: KVM's log alone, without the vGPU's DMA log, misses the pages the vGPU wrote.
    let no_gpu = Options {
        gpu_dirty: false,
        ..opts()
    };
    let (_, same) = migrate(
        "control: get, KVM's log alone",
        &base,
        DirtyLogWant::Get,
        &no_gpu,
    );
    assert!(!same, "GET without the vGPU's log gave the same result");
    // The x_ controls of manual protect do nothing with GET (every read clears).
    let both = Options {
        x_skip_clear: true,
        ..opts()
    };
    let (_, same) = migrate(
        "get, x_skip_clear (no effect)",
        &base,
        DirtyLogWant::Get,
        &both,
    );
    assert!(same, "GET: x_skip_clear changed the result");
}

/// `overlap_stop`: the pages KVM's log lists go while the vGPU stops on another thread, then the
/// pages the vGPU's log lists. The destination finishes as the unmigrated run; without the
/// vGPU's log (its pages after the stop never go) it differs.
#[test]
fn an_overlapped_stop_migrates_exactly() {
    if !kvm_present() {
        return;
    }
    let base = baseline(&cfg());
    let o = Options {
        overlap_stop: true,
        ..opts()
    };
    let (rep, same) = migrate("overlapped stop", &base, DirtyLogWant::Auto, &o);
    assert!(same, "overlapped stop: the destination differs");
    assert!(
        rep.final_gpu_only_pages > 0 && rep.final_pages > rep.final_gpu_only_pages,
        "overlapped stop: the stop sent no page of one of the logs: {rep:?}"
    );
    let no_gpu = Options {
        gpu_dirty: false,
        ..o
    };
    let (_, same) = migrate(
        "control: overlapped stop, KVM's log alone",
        &base,
        DirtyLogWant::Auto,
        &no_gpu,
    );
    assert!(
        !same,
        "overlapped stop without the vGPU's log gave the same result"
    );
}
