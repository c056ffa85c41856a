//! Private libvirt daemons around gmig's QEMU hook (`integrations/libvirt/lab.sh`), shared by
//! the libvirt tests (`crates/gmig-cli/tests/libvirt.rs`) and the libvirt evacuation bench
//! (`crates/gmig-cli/benches/libvirt_evacuate.rs`).
//!
//! [`Daemon`] is one private libvirtd (`lab.sh start`), [`NetPair`] two network namespaces joined
//! by a veth pair, [`domain_xml`] the domain of `lab.sh domain` (QEMU under TCG, the Linux guest,
//! the vGPU as a `vfio-user-pci` device in a slot of its own), [`unmigrated`] the same guest in
//! QEMU without libvirt or migration, for reference sums.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::qemu::{checksum_line, repo_root, Serve, Tools, Vm, VmSpec};

fn lab() -> PathBuf {
    repo_root().join("integrations/libvirt/lab.sh")
}

/// A finished command's stdout and stderr, one after the other.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `lab.sh ARGS`, returning its stdout (trimmed) or why it failed.
///
/// # Errors
/// When lab.sh cannot run or exits unsuccessfully (its output in the message).
pub fn lab_run(args: &[&str]) -> Result<String, String> {
    let o = Command::new(lab())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("lab.sh: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    } else {
        Err(format!(
            "lab.sh {} ({}): {}",
            args.join(" "),
            o.status,
            text(&o)
        ))
    }
}

/// Whether libvirtd can run here (its packages installed first, as the scripts do, once per
/// process); says why loudly (`SKIPPED: …` on stderr) when not.
pub fn libvirt_ready() -> bool {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    let ready = READY.get_or_init(|| {
        if !is_root() {
            return Err("not root: a private system libvirtd needs root".into());
        }
        lab_run(&["install"])
            .map_err(|e| format!("libvirt's packages could not be installed: {e}"))?;
        lab_run(&["check"]).map_err(|e| format!("libvirtd cannot run here: {e}"))?;
        Ok(())
    });
    if let Err(why) = ready {
        eprintln!("SKIPPED: {why}");
    }
    ready.is_ok()
}

/// Whether the effective user is root (from /proc/self/status: Uid: real effective ...).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|u| u.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Whether QEMU carries gmig's migration patches (scripts/qemu/build.sh applies every one).
pub fn qemu_patched() -> bool {
    std::fs::read_dir(repo_root().join("integrations/qemu/patches"))
        .map(|d| {
            d.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "patch"))
        })
        .unwrap_or(false)
}

/// A private libvirtd (`lab.sh start DIR ...`); stopped, with all it started, when dropped.
pub struct Daemon {
    /// Its directory (configuration, run, state and logs).
    pub dir: PathBuf,
    /// Its connection URI.
    pub uri: String,
}

impl Daemon {
    /// Starts a daemon in `dir` whose hook runs `gmig`, with more `lab.sh start` arguments.
    ///
    /// # Panics
    /// When the daemon does not start (a set-up error).
    pub fn start(gmig: &Path, dir: PathBuf, args: &[&str]) -> Daemon {
        let dir_s = dir.to_string_lossy().to_string();
        let gmig_s = gmig.to_string_lossy().to_string();
        let mut a = vec!["start", &dir_s, "--gmig", &gmig_s];
        a.extend_from_slice(args);
        let uri = lab_run(&a).unwrap_or_else(|e| panic!("libvirtd did not start: {e}"));
        Daemon { dir, uri }
    }

    /// `virsh ARGS` against this daemon (at most 300 s).
    ///
    /// # Panics
    /// When virsh cannot be run.
    pub fn virsh(&self, args: &[&str]) -> Output {
        Command::new("timeout")
            .arg("300")
            .arg("virsh")
            .arg("-c")
            .arg(&self.uri)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("virsh")
    }

    /// `virsh ARGS`, which must succeed; its output.
    ///
    /// # Panics
    /// When virsh fails (its output and the daemon's logs in the message).
    #[track_caller]
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.virsh(args);
        assert!(
            o.status.success(),
            "virsh {}: {}\n{}",
            args.join(" "),
            text(&o),
            self.logs()
        );
        text(&o)
    }

    /// `virsh domstate NAME`.
    pub fn state(&self, name: &str) -> String {
        text(&self.virsh(&["domstate", name])).trim().to_string()
    }

    /// A file under the daemon's directory (empty when absent), without carriage returns.
    pub fn file(&self, rel: &str) -> String {
        String::from_utf8_lossy(&std::fs::read(self.dir.join(rel)).unwrap_or_default())
            .replace('\r', "")
    }

    /// The domain's serial console so far.
    pub fn serial(&self, name: &str) -> String {
        self.file(&format!("log/qemu/{name}.serial"))
    }

    /// The hook's log, QEMU's and the server's logs, libvirtd's errors: for failure messages.
    pub fn logs(&self) -> String {
        let errors: String = self
            .file("log/libvirtd.log")
            .lines()
            .filter(|l| l.contains(" error : "))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut s = format!(
            "--- {}: hook log:\n{}--- libvirtd errors:\n{errors}",
            self.dir.display(),
            self.file("log/gmig-hook.log")
        );
        if let Ok(d) = std::fs::read_dir(self.dir.join("log/qemu")) {
            for e in d.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                if n.ends_with(".log") {
                    let t = self.file(&format!("log/qemu/{n}"));
                    let tail: Vec<&str> = t.lines().rev().take(25).collect();
                    s += &format!("--- log/qemu/{n} (tail):\n");
                    for l in tail.into_iter().rev() {
                        s += l;
                        s.push('\n');
                    }
                }
            }
        }
        s
    }

    /// The hook's pid files left for the domain (its servers).
    pub fn servers(&self, name: &str) -> usize {
        let pre = format!("{name}.");
        std::fs::read_dir(self.dir.join("gmig/libvirt"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&pre))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Polls `done` until it holds, up to `limit`; whether it did (said on stderr, naming
    /// `what`, when it did not).
    pub fn wait_until(&self, what: &str, limit: Duration, done: impl Fn(&Daemon) -> bool) -> bool {
        let held = crate::poll_until(limit, Duration::from_millis(100), || done(self));
        if !held {
            eprintln!("{}: not {what} after {limit:?}", self.dir.display());
        }
        held
    }

    /// Waits until `done` holds of the domain's serial console, up to `limit`.
    pub fn wait_serial(&self, name: &str, limit: Duration, done: impl Fn(&str) -> bool) -> bool {
        self.wait_until("the awaited serial output", limit, |d| {
            done(&d.serial(name))
        })
    }

    /// Waits up to `limit` until the guest of `name` has rendered frame 64 (it runs and draws),
    /// and fails with its console and the daemon's logs otherwise.
    pub fn assert_rendering(&self, name: &str, limit: Duration) {
        assert!(
            self.wait_serial(name, limit, |c| c
                .lines()
                .any(|l| l.starts_with("frame 64 "))),
            "{name} did not render on {}:\n{}\n{}",
            self.dir.display(),
            self.serial(name),
            self.logs()
        );
    }

    /// Waits up to `limit` for the guest of `name` to finish, and checks that it finished well
    /// (exit 0, no submission timed out); its console.
    pub fn wait_finished(&self, name: &str, limit: Duration) -> String {
        let done = self.wait_serial(name, limit, |c| c.contains("GMIG-GUEST: exit"));
        let console = self.serial(name);
        assert!(
            done,
            "{name} did not finish on {}:\n{console}",
            self.dir.display()
        );
        assert!(
            console.contains("GMIG-GUEST: exit 0") && !console.contains("seqno timeout"),
            "{name} failed on {}:\n{console}",
            self.dir.display()
        );
        console
    }

    /// Waits (up to 30 s) until the hook has stopped every server of the domain; whether it did.
    pub fn servers_gone(&self, name: &str) -> bool {
        self.wait_until("every server stopped", Duration::from_secs(30), |d| {
            d.servers(name) == 0
        })
    }

    /// Whether the daemon knows the domain (running, or defined and shut off).
    pub fn knows(&self, name: &str) -> bool {
        text(&self.virsh(&["list", "--all", "--name"]))
            .lines()
            .any(|l| l.trim() == name)
    }

    /// Waits until the domain is in state `want`, up to `limit`.
    pub fn wait_state(&self, name: &str, want: &str, limit: Duration) -> bool {
        self.wait_until(&format!("{name} {want}"), limit, |d| d.state(name) == want)
    }

    /// Writes `xml` to `scratch/NAME.xml` and `virsh define`s it.
    ///
    /// # Panics
    /// When the file cannot be written or virsh refuses the domain.
    pub fn define(&self, scratch: &Path, name: &str, xml: &str) {
        let path = scratch.join(format!("{name}.xml"));
        std::fs::write(&path, xml).expect("domain XML file");
        self.ok(&["define", &path.to_string_lossy()]);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = lab_run(&["stop", &self.dir.to_string_lossy()]);
    }
}

/// Two network namespaces joined by a veth pair (`lab.sh net-up`); removed when dropped.
pub struct NetPair {
    /// The first namespace (address [`NetPair::ADDR_A`]).
    pub a: String,
    /// The second namespace (address [`NetPair::ADDR_B`]).
    pub b: String,
}

impl NetPair {
    /// The first namespace's address.
    pub const ADDR_A: &'static str = "10.231.31.1";
    /// The second namespace's address.
    pub const ADDR_B: &'static str = "10.231.31.2";

    /// Brings the pair up, named from `tag` and the process id.
    ///
    /// # Panics
    /// When lab.sh cannot create them (a set-up error).
    pub fn up(tag: &str) -> NetPair {
        let id = std::process::id();
        let pair = NetPair {
            a: format!("gmig{tag}{id}a"),
            b: format!("gmig{tag}{id}b"),
        };
        let aa = format!("{}/24", Self::ADDR_A);
        let ba = format!("{}/24", Self::ADDR_B);
        lab_run(&["net-up", &pair.a, &aa, &pair.b, &ba])
            .unwrap_or_else(|e| panic!("network namespaces: {e}"));
        pair
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        let _ = lab_run(&["net-down", &self.a, &self.b]);
    }
}

/// The domain XML of `lab.sh domain` for this guest (desktop profile, `frames` frames), its
/// vGPU in host slot `slot` (before the daemon's `--slot-offset`).
///
/// # Panics
/// When lab.sh fails (a set-up error).
pub fn domain_xml(tools: &Tools, name: &str, frames: u32, ram_mib: u32, slot: u32) -> String {
    let q = tools.qemu.to_string_lossy().to_string();
    let k = tools.kernel.to_string_lossy().to_string();
    let i = tools.initrd.to_string_lossy().to_string();
    let (f, r, s) = (frames.to_string(), ram_mib.to_string(), slot.to_string());
    lab_run(&[
        "domain",
        "--name",
        name,
        "--qemu",
        &q,
        "--kernel",
        &k,
        "--initrd",
        &i,
        "--frames",
        &f,
        "--ram-mib",
        &r,
        "--slot",
        &s,
    ])
    .unwrap_or_else(|e| panic!("domain XML: {e}"))
}

/// The console of the same guest in QEMU without libvirt and without migration
/// (`scripts/qemu/run.sh`'s VM: -cpu max, memfd RAM, `gmig serve --ram-by-vmm`).
///
/// # Panics
/// When the run fails or prints no checksum.
pub fn unmigrated(gmig: &Path, tools: &Tools, dir: &Path, frames: u32, ram_mib: u64) -> String {
    std::fs::create_dir_all(dir).expect("run directory");
    let serve = Serve::start(gmig, dir, "gpu", &["--clients", "1"]);
    let spec = VmSpec {
        gpus: vec![serve.socket.clone()],
        run: Some(format!(
            "/bin/gmig-guest,--profile,desktop,--frames,{frames}"
        )),
        ram_mib,
        ..VmSpec::default()
    };
    let mut vm = Vm::start(tools, &spec, dir, "qemu");
    let status = vm.wait_exit(Duration::from_secs(600));
    let console = vm.console();
    assert!(
        status.is_some_and(|s| s.success()) && console.contains("GMIG-GUEST: exit 0"),
        "the unmigrated run failed ({status:?}):\n{console}\n{}",
        vm.stderr_text()
    );
    assert!(
        checksum_line(&console).is_some(),
        "no checksum line in the unmigrated run:\n{console}"
    );
    console
}

/// The `frame N sum S` lines of a console, by frame number.
pub fn frame_sums(console: &str) -> BTreeMap<u64, String> {
    console
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next(), w.next()) {
                (Some("frame"), Some(n), Some("sum"), Some(s)) => {
                    Some((n.parse().ok()?, s.to_string()))
                }
                _ => None,
            }
        })
        .collect()
}

/// After `virsh migrate` of `name` from `from` to `to`, which printed `o`: the guest was still
/// rendering on `from` when it switched over (else the run is too short to show the destination
/// rendering: raise its frame count), the command succeeded, and `to` runs the domain. Returns
/// `from`'s console.
pub fn assert_switched_over(from: &Daemon, to: &Daemon, name: &str, o: &Output) -> String {
    let console = from.serial(name);
    assert!(
        !console.contains("GMIG-GUEST: exit"),
        "{name} finished on {} before the switch-over: raise the frame count\n{console}",
        from.dir.display()
    );
    assert!(
        o.status.success(),
        "virsh migrate {name}: {}\n{}\n{}",
        text(o),
        from.logs(),
        to.logs()
    );
    assert_eq!(to.state(name), "running", "{}", to.logs());
    console
}

/// Checks a migrated guest against its unmigrated run (`reference`): every running sum each of
/// `consoles` printed is the reference's for that frame, and `finished` (the console it ended on)
/// has the reference's checksum line. `who` names the guest in a failure.
pub fn assert_renders_as_unmigrated(reference: &str, consoles: &[&str], finished: &str, who: &str) {
    let want = frame_sums(reference);
    for console in consoles {
        for (n, sum) in frame_sums(console) {
            assert_eq!(
                want.get(&n),
                Some(&sum),
                "{who}, frame {n}: the running sum differs from the unmigrated run's"
            );
        }
    }
    assert_eq!(
        checksum_line(finished),
        checksum_line(reference),
        "{who}: the checksum differs from the unmigrated run's"
    );
}

/// The last frame number a console printed a running sum for (0: none yet).
pub fn last_frame(console: &str) -> u64 {
    frame_sums(console).keys().next_back().copied().unwrap_or(0)
}
