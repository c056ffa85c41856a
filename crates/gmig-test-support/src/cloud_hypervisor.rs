//! cloud-hypervisor around a gmig vGPU, for tests: cloud-hypervisor and ch-remote built from the
//! shared source tarballs by `scripts/cloud-hypervisor/build.sh` (cached outside the clone), the
//! guest GPU driver as a PVH ELF (`gmig_vmm::guest::PVH_ELF`, written to a file by the test), and
//! cloud-hypervisor processes with their serial console in a file.
//!
//! The tests do not build cloud-hypervisor themselves (a first build takes minutes; `.ci/run`
//! builds it before the tests): [`binaries`] says loudly when it is not built, so a test can skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::qemu::repo_root;

/// The folder holding the built `cloud-hypervisor` and `ch-remote`, or `None` (said loudly)
/// where `scripts/cloud-hypervisor/build.sh` has not built them for this key, or where
/// `/dev/kvm` is absent.
pub fn binaries() -> Option<PathBuf> {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm is absent: cloud-hypervisor cannot run here");
        return None;
    }
    let script = repo_root().join("scripts/cloud-hypervisor/build.sh");
    let cached = Command::new(&script)
        .arg("--check")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !cached {
        eprintln!(
            "SKIPPED: cloud-hypervisor is not built: run scripts/cloud-hypervisor/build.sh \
             (minutes; .ci/run does) to run the cloud-hypervisor tests"
        );
        return None;
    }
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .expect("scripts/cloud-hypervisor/build.sh");
    assert!(
        out.status.success(),
        "scripts/cloud-hypervisor/build.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(PathBuf::from)
        .expect("scripts/cloud-hypervisor/build.sh printed no folder");
    Some(dir)
}

/// How a cloud-hypervisor VM is started.
#[derive(Debug, Clone)]
pub struct ChSpec {
    /// The `--kernel` ELF.
    pub kernel: PathBuf,
    /// Its `--cmdline`.
    pub cmdline: String,
    /// `--memory` (e.g. `size=128M,shared=on`).
    pub memory: String,
    /// vfio-user sockets, one `--user-device socket=…` each.
    pub user_devices: Vec<PathBuf>,
    /// `--api-socket` (for `ch-remote`), if any.
    pub api_socket: Option<PathBuf>,
    /// The serial console's file, if not `DIR/NAME.console`.
    pub console: Option<PathBuf>,
}

/// A cloud-hypervisor process: serial console in `DIR/NAME.console`, its log (`-v`) in
/// `DIR/NAME.log`; killed when dropped.
#[derive(Debug)]
pub struct Ch {
    /// The process.
    pub child: Child,
    /// The serial console's file.
    pub console: PathBuf,
    /// cloud-hypervisor's own log (stderr and stdout).
    pub log: PathBuf,
}

impl Ch {
    /// Starts `BIN/cloud-hypervisor` for `spec`.
    pub fn start(bin: &Path, spec: &ChSpec, dir: &Path, name: &str) -> Ch {
        let console = spec
            .console
            .clone()
            .unwrap_or_else(|| dir.join(format!("{name}.console")));
        let log = dir.join(format!("{name}.log"));
        let mut cmd = Command::new(bin.join("cloud-hypervisor"));
        if let Some(api) = &spec.api_socket {
            cmd.arg("--api-socket").arg(api);
        }
        cmd.arg("--kernel")
            .arg(&spec.kernel)
            .arg(format!("--cmdline={}", spec.cmdline))
            .args(["--memory", &spec.memory, "--cpus", "boot=1"])
            .arg("--serial")
            .arg(format!("file={}", console.display()))
            .args(["--console", "off", "-v"]);
        for s in &spec.user_devices {
            cmd.arg("--user-device")
                .arg(format!("socket={}", s.display()));
        }
        Self::spawn(cmd, console, log)
    }

    /// Starts `BIN/cloud-hypervisor --api-socket API` with no VM: a migration's destination
    /// (`ch-remote receive-migration`). Its console is the source's configuration's.
    pub fn start_destination(bin: &Path, api: &Path, dir: &Path, name: &str) -> Ch {
        let mut cmd = Command::new(bin.join("cloud-hypervisor"));
        cmd.arg("--api-socket").arg(api).arg("-v");
        Self::spawn(
            cmd,
            dir.join(format!("{name}.console")),
            dir.join(format!("{name}.log")),
        )
    }

    fn spawn(mut cmd: Command, console: PathBuf, log: PathBuf) -> Ch {
        let out = std::fs::File::create(&log).expect("cloud-hypervisor log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start cloud-hypervisor");
        Ch {
            child,
            console,
            log,
        }
    }

    /// What the guest printed so far.
    pub fn console_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console).unwrap_or_default()).into_owned()
    }

    /// What cloud-hypervisor logged so far.
    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Waits at most `limit` until `done` holds for the console and the log (in that order);
    /// whether it did.
    pub fn wait_for(&self, limit: Duration, done: impl Fn(&str, &str) -> bool) -> bool {
        crate::poll_until(limit, Duration::from_millis(100), || {
            done(&self.console_text(), &self.log_text())
        })
    }

    /// Waits at most `limit` for the process to exit (the guest powers the VM off when done);
    /// `None` when it still runs.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let t = Instant::now();
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if t.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs `BIN/ch-remote --api-socket API ARGS…` to its end; its output, or why it failed.
pub fn ch_remote(bin: &Path, api: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(bin.join("ch-remote"))
        .arg("--api-socket")
        .arg(api)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ch-remote: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("ch-remote {args:?}: {}: {text}", out.status))
    }
}

/// Waits at most `limit` for `path` to exist; whether it does.
pub fn wait_path(path: &Path, limit: Duration) -> bool {
    crate::poll_until(limit, Duration::from_millis(20), || path.exists())
}

impl Drop for Ch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
