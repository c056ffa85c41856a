//! A real QEMU around a gmig vGPU, for tests: QEMU 10.2.2 built from the shared source tarball
//! (`scripts/qemu/build.sh`), Debian's cloud kernel with a busybox initramfs that carries the
//! guest GPU driver as a Linux program (`scripts/qemu/guest.sh`,
//! `crates/gmig-vmm/guest/build-linux.sh`), `gmig serve` processes, and QEMU processes with their
//! serial console in a file and a QMP socket.
//!
//! Guests run under TCG (`accel=tcg`, `-cpu max`): the development machines' KVM stops a stock
//! Linux kernel with an emulation failure. Everything here is built or fetched by the project's
//! own scripts and cached outside the clone; [`Tools::get`] says why when it cannot be had, so a
//! test can skip loudly.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod pair;
pub mod screen;

/// The repository's root (this crate sits in `crates/gmig-test-support`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One QEMU test at a time in this test process (each runs QEMUs under TCG on two cores): hold
/// the guard for the test's length.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether QEMU's source tarball is beside the repository (`../shared/qemu`, or `$GMIG_SHARED`),
/// so the QEMU tests can build QEMU; says loudly that they skip when it is not.
pub fn qemu_source_present() -> bool {
    let shared = std::env::var_os("GMIG_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared"));
    let tarball = shared.join("qemu/qemu_10.2.2+ds.orig.tar.xz");
    if tarball.exists() {
        return true;
    }
    eprintln!(
        "SKIPPED: QEMU's source tarball is not at {}: the QEMU tests cannot build QEMU here",
        tarball.display()
    );
    false
}

/// Runs a script of the repository and returns its stdout lines, or why it failed.
fn script(args: &[&str]) -> Result<Vec<String>, String> {
    let root = repo_root();
    let out = Command::new(root.join(args[0]))
        .args(&args[1..])
        .current_dir(&root)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(15).collect();
        return Err(format!(
            "{} failed ({}): {}",
            args.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// QEMU, a kernel and an initramfs with the guest GPU driver at `/bin/gmig-guest`.
#[derive(Debug, Clone)]
pub struct Tools {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// The guest kernel.
    pub kernel: PathBuf,
    /// The guest's initramfs.
    pub initrd: PathBuf,
}

impl Tools {
    /// Builds (or finds cached) QEMU and the guest; the first build of QEMU takes ~8 minutes on
    /// two cores. `Err` says why they cannot be had here.
    pub fn get(work: &Path) -> Result<Tools, String> {
        let qemu = script(&["scripts/qemu/build.sh"])?
            .pop()
            .ok_or("scripts/qemu/build.sh printed no path")?;
        let bin = work.join("gmig-guest");
        let bin_s = bin.to_string_lossy().to_string();
        script(&["crates/gmig-vmm/guest/build-linux.sh", &bin_s])?;
        let add = format!("{bin_s}:/bin/gmig-guest");
        let out = work.join("guest");
        let out_s = out.to_string_lossy().to_string();
        let lines = script(&["scripts/qemu/guest.sh", "--add", &add, "--out", &out_s])?;
        let find = |k: &str| {
            lines
                .iter()
                .find_map(|l| l.strip_prefix(k))
                .map(PathBuf::from)
                .ok_or(format!("scripts/qemu/guest.sh printed no {k}"))
        };
        Ok(Tools {
            qemu: PathBuf::from(qemu),
            kernel: find("KERNEL=")?,
            initrd: find("INITRD=")?,
        })
    }
}

/// A `gmig serve` process; killed when dropped.
#[derive(Debug)]
pub struct Serve {
    /// The process.
    pub child: Child,
    /// Its socket.
    pub socket: PathBuf,
    /// Its stderr (logs).
    pub log: PathBuf,
}

impl Serve {
    /// Starts `gmig serve --socket DIR/NAME.sock --ram-by-vmm` with `args` added, and waits for
    /// its socket.
    pub fn start(gmig: &Path, dir: &Path, name: &str, args: &[&str]) -> Serve {
        let socket = dir.join(format!("{name}.sock"));
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(gmig)
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--ram-by-vmm")
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("serve log"))
            .spawn()
            .expect("start gmig serve");
        let t = Instant::now();
        while !socket.exists() && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            socket.exists(),
            "gmig serve never listened on {}",
            socket.display()
        );
        Serve { child, socket, log }
    }

    /// What it logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether it still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The kernel parameter that keeps drm's fbdev emulation (and so fbcon) off in an i915 guest.
/// fbcon draws its console through the aperture (BAR2): with QEMU's
/// `vfio-user-pci.x-no-posted-writes` every such write waits for the server, and its first
/// drawing of a 1024x768 console takes over a minute under TCG (a soft lockup). Tests of other
/// things than the display that turn posted writes off pass it.
pub const NO_FBCON: &str = "drm_kms_helper.fbdev_emulation=0";

/// How a QEMU process is started.
#[derive(Debug, Clone, Default)]
pub struct VmSpec {
    /// vGPU sockets, one `vfio-user-pci` device each (ids `gpu0`, `gpu1`, …).
    pub gpus: Vec<PathBuf>,
    /// Put each vGPU behind its own `pcie-root-port` (for hot-unplug).
    pub root_ports: bool,
    /// The guest's command (`gmig.run=`, argv joined by commas), if any.
    pub run: Option<String>,
    /// Guest RAM, MiB.
    pub ram_mib: u64,
    /// More QEMU arguments.
    pub extra: Vec<String>,
    /// More kernel command-line parameters.
    pub kernel_args: Vec<String>,
    /// `display=on` on each `vfio-user-pci` (QEMU shows the vGPU's plane; patch 0006).
    pub display: bool,
}

/// A QEMU process with its serial console in a file and a QMP socket; killed when dropped.
#[derive(Debug)]
pub struct Vm {
    /// The process.
    pub child: Child,
    /// The serial console's file.
    pub serial: PathBuf,
    /// QEMU's own stderr.
    pub stderr: PathBuf,
    qmp_path: PathBuf,
    qmp: Option<BufReader<UnixStream>>,
    started: Instant,
}

impl Vm {
    /// The command line of [`Vm::start`], for documentation and reuse.
    pub fn command(tools: &Tools, spec: &VmSpec, dir: &Path, name: &str) -> Command {
        let mut c = Command::new(&tools.qemu);
        let mib = if spec.ram_mib == 0 {
            1024
        } else {
            spec.ram_mib
        };
        c.args([
            "-machine",
            "q35,accel=tcg,memory-backend=mem",
            "-cpu",
            "max",
        ])
        .arg("-m")
        .arg(format!("{mib}M"))
        .arg("-object")
        .arg(format!("memory-backend-memfd,id=mem,size={mib}M,share=on"))
        .args([
            "-nodefaults",
            "-nographic",
            "-no-reboot",
            "-display",
            "none",
        ])
        .arg("-serial")
        .arg(format!(
            "file:{}",
            dir.join(format!("{name}.serial")).display()
        ))
        .arg("-qmp")
        .arg(format!(
            "unix:{},server=on,wait=off",
            dir.join(format!("{name}.qmp")).display()
        ))
        .arg("-kernel")
        .arg(&tools.kernel)
        .arg("-initrd")
        .arg(&tools.initrd);
        // `no_timer_check`: under TCG on a loaded host the kernel's IO-APIC timer check can miss
        // its ticks and panic ("IO-APIC + timer doesn't work!", seen once in CI on 2 cores).
        let mut append = String::from("console=ttyS0 panic=-1 quiet no_timer_check");
        for a in &spec.kernel_args {
            append.push(' ');
            append.push_str(a);
        }
        if let Some(run) = &spec.run {
            append.push_str(" gmig.run=");
            append.push_str(run);
        }
        c.arg("-append").arg(append);
        for (i, g) in spec.gpus.iter().enumerate() {
            let bus = if spec.root_ports {
                c.arg("-device").arg(format!(
                    "pcie-root-port,id=rp{i},slot={},chassis={}",
                    i + 1,
                    i + 1
                ));
                format!(",\"bus\":\"rp{i}\"")
            } else {
                String::new()
            };
            let display = if spec.display {
                ",\"display\":\"on\""
            } else {
                ""
            };
            c.arg("-device").arg(format!(
                "{{\"driver\":\"vfio-user-pci\",\"id\":\"gpu{i}\"{bus}{display},\"socket\":{{\"path\":\"{}\",\"type\":\"unix\"}}}}",
                g.display()
            ));
        }
        c.args(&spec.extra);
        c
    }

    /// Starts QEMU.
    pub fn start(tools: &Tools, spec: &VmSpec, dir: &Path, name: &str) -> Vm {
        let stderr = dir.join(format!("{name}.stderr"));
        let child = Self::command(tools, spec, dir, name)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("qemu stderr"))
            .spawn()
            .expect("start QEMU");
        Vm {
            child,
            serial: dir.join(format!("{name}.serial")),
            stderr,
            qmp_path: dir.join(format!("{name}.qmp")),
            qmp: None,
            started: Instant::now(),
        }
    }

    /// The serial console so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.serial).unwrap_or_default()).into_owned()
    }

    /// QEMU's stderr so far.
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits until the console has a line for which `done` holds, QEMU exits, or `limit`
    /// passes; returns whether the line came.
    pub fn wait_for(&mut self, limit: Duration, done: impl Fn(&str) -> bool) -> bool {
        // Stops early when QEMU has exited (no line can come any more), then looks once more.
        crate::poll_until(limit, Duration::from_millis(50), || {
            self.console().lines().any(&done) || !matches!(self.child.try_wait(), Ok(None))
        });
        self.console().lines().any(&done)
    }

    /// Waits for QEMU to exit by itself (the guest powers off), up to `limit`; kills it after.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }

    /// Waits up to `limit` for the guest to power QEMU off, prints the console, QEMU's stderr and
    /// `serve`'s log, asserts that QEMU exited cleanly, and returns the console.
    pub fn run_to_poweroff(&mut self, limit: Duration, serve: &Serve) -> String {
        let status = self.wait_exit(limit);
        let console = self.console();
        eprintln!(
            "QEMU ran {:.1} s; console:\n{console}\nQEMU stderr:\n{}\nserver log:\n{}",
            self.started.elapsed().as_secs_f64(),
            self.stderr_text(),
            serve.log_text()
        );
        assert!(
            status.is_some_and(|s| s.success()),
            "QEMU did not power off cleanly: {status:?}"
        );
        console
    }

    /// Sends one QMP command (JSON) and returns its answer (`return` or `error`), connecting
    /// and negotiating capabilities on first use; events read meanwhile are kept in `events`.
    pub fn qmp(&mut self, cmd: &str, events: &mut Vec<String>) -> Result<String, String> {
        if self.qmp.is_none() {
            let t = Instant::now();
            let s = loop {
                match UnixStream::connect(&self.qmp_path) {
                    Ok(s) => break s,
                    Err(e) if t.elapsed() > Duration::from_secs(20) => {
                        return Err(format!("QMP connect: {e}"))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            s.set_read_timeout(Some(Duration::from_secs(60)))
                .map_err(|e| e.to_string())?;
            let mut r = BufReader::new(s);
            let mut greeting = String::new();
            r.read_line(&mut greeting).map_err(|e| e.to_string())?;
            self.qmp = Some(r);
            self.qmp(r#"{"execute":"qmp_capabilities"}"#, events)?;
        }
        let r = self.qmp.as_mut().ok_or("no QMP")?;
        r.get_mut()
            .write_all(format!("{cmd}\n").as_bytes())
            .map_err(|e| e.to_string())?;
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err("QMP closed".into());
            }
            if line.contains("\"event\"") {
                events.push(line);
                continue;
            }
            return Ok(line);
        }
    }

    /// Reads QMP events until one contains `what` or `limit` passes.
    pub fn qmp_event(&mut self, what: &str, limit: Duration, events: &mut Vec<String>) -> bool {
        if events.iter().any(|e| e.contains(what)) {
            return true;
        }
        let Some(r) = self.qmp.as_mut() else {
            return false;
        };
        let t = Instant::now();
        let _ = r
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)));
        while t.elapsed() < limit {
            let mut line = String::new();
            match r.read_line(&mut line) {
                Ok(0) => return false,
                Ok(_) => {
                    let hit = line.contains(what);
                    events.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(_) => {}
            }
        }
        false
    }

    /// Kills QEMU at once (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the guest GPU driver prints under `gmig vm run ARGS` (KVM, gmig's own VMM, no QEMU), the
/// reference of the QEMU, libvirt and cloud-hypervisor tests; panics, with its stderr, when the
/// run fails.
pub fn vm_run_output(gmig: &Path, args: &[&str]) -> String {
    let out = Command::new(gmig)
        .args(["vm", "run"])
        .args(args)
        .output()
        .expect("gmig vm run");
    assert!(
        out.status.success(),
        "gmig vm run {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The checksum line the driver prints under `gmig vm run --profile PROFILE --frames FRAMES`.
pub fn vm_run_checksum(gmig: &Path, profile: &str, frames: u32) -> String {
    let text = vm_run_output(
        gmig,
        &["--profile", profile, "--frames", &frames.to_string()],
    );
    checksum_line(&text).unwrap_or_else(|| panic!("gmig vm run printed no checksum:\n{text}"))
}

/// The `checksum …` line of a guest GPU driver's output.
pub fn checksum_line(text: &str) -> Option<String> {
    text.lines()
        .map(|l| l.trim_end_matches('\r'))
        .find(|l| l.starts_with("checksum"))
        .map(str::to_string)
}
