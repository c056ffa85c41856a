//! A QEMU live migration on one machine: two `gmig serve` processes (the source's vGPU in host
//! slot 0, the destination's in slot 1, so its graphics addresses move) and two QEMU processes,
//! the destination waiting with `-incoming tcp:127.0.0.1:PORT`, driven over QMP.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Serve, Tools, Vm, VmSpec};

/// A TCP port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One QMP command; its `return` (panics on an error answer).
pub fn qmp_return(vm: &mut Vm, cmd: &str) -> Value {
    let mut events = Vec::new();
    let answer = vm.qmp(cmd, &mut events).expect("QMP");
    let v: Value = serde_json::from_str(&answer).expect("QMP answer is JSON");
    assert!(v.get("return").is_some(), "{cmd}: {answer}");
    v["return"].clone()
}

/// Source and destination: two `gmig serve` (slots 0 and 1) and two QEMUs.
pub struct Pair {
    /// The source's vGPU server (slot 0).
    pub src_serve: Serve,
    /// The destination's vGPU server (slot 1).
    pub dst_serve: Serve,
    /// The source QEMU.
    pub src: Vm,
    /// The destination QEMU (`-incoming`).
    pub dst: Vm,
    /// The destination's migration port.
    pub port: u16,
}

impl Pair {
    /// Starts the four processes; their files in `dir` are named after `tag`. `spec(socket,
    /// extra)` is each side's VM given its server's socket and the QEMU arguments the side
    /// needs (the destination's `-incoming`); a spec without vGPUs leaves the servers idle.
    pub fn start(
        gmig: &Path,
        tools: &Tools,
        dir: &Path,
        tag: &str,
        src_args: &[&str],
        dst_args: &[&str],
        spec: impl Fn(&Path, Vec<String>) -> VmSpec,
    ) -> Pair {
        let port = free_port();
        let src_serve = Serve::start(gmig, dir, &format!("{tag}-src-gpu"), src_args);
        let mut args = vec!["--slot", "1"];
        args.extend_from_slice(dst_args);
        let dst_serve = Serve::start(gmig, dir, &format!("{tag}-dst-gpu"), &args);
        let incoming = vec!["-incoming".to_string(), format!("tcp:127.0.0.1:{port}")];
        let dst = Vm::start(
            tools,
            &spec(&dst_serve.socket, incoming),
            dir,
            &format!("{tag}-dst"),
        );
        let src = Vm::start(
            tools,
            &spec(&src_serve.socket, vec![]),
            dir,
            &format!("{tag}-src"),
        );
        Pair {
            src_serve,
            dst_serve,
            src,
            dst,
            port,
        }
    }

    /// What all four processes said, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "--- source console:\n{}\n--- source QEMU:\n{}\n--- source server:\n{}\n\
             --- destination console:\n{}\n--- destination QEMU:\n{}\n--- destination server:\n{}",
            self.src.console(),
            self.src.stderr_text(),
            self.src_serve.log_text(),
            self.dst.console(),
            self.dst.stderr_text(),
            self.dst_serve.log_text()
        )
    }

    /// Waits (up to five minutes) until the source's console has a line for which `line`
    /// holds.
    pub fn wait_source(&mut self, line: impl Fn(&str) -> bool) {
        assert!(
            self.src.wait_for(Duration::from_secs(300), line),
            "the source guest did not get there:\n{}",
            self.logs()
        );
    }

    /// Sends `migrate` (with `params` set first); the answer (`return` or `error`).
    pub fn start_migration(&mut self, params: &str) -> String {
        qmp_return(
            &mut self.src,
            &format!(r#"{{"execute":"migrate-set-parameters","arguments":{params}}}"#),
        );
        let mut events = Vec::new();
        self.src
            .qmp(
                &format!(
                    r#"{{"execute":"migrate","arguments":{{"uri":"tcp:127.0.0.1:{}"}}}}"#,
                    self.port
                ),
                &mut events,
            )
            .expect("QMP migrate")
    }

    /// Polls `query-migrate` on the source until it ends; its last answer.
    pub fn wait_migration(&mut self) -> Value {
        wait_migration(&mut self.src)
            .unwrap_or_else(|q| panic!("the migration did not end: {q}\n{}", self.logs()))
    }

    /// Sets `params`, sends `migrate` (which must be accepted) and waits for it to end; the
    /// last `query-migrate` answer (its `status` is for the caller to judge).
    pub fn migrate(&mut self, params: &str) -> Value {
        let answer = self.start_migration(params);
        assert!(
            answer.contains("\"return\""),
            "migrate: {answer}\n{}",
            self.logs()
        );
        self.wait_migration()
    }

    /// The destination guest's end: waits for its QEMU to exit; its console.
    pub fn finish(&mut self) -> String {
        let status = self.dst.wait_exit(Duration::from_secs(600));
        let console = self.dst.console();
        assert!(
            status.is_some(),
            "the destination guest did not finish:\n{}",
            self.logs()
        );
        console
    }
}

/// One HMP command line (what a user types at QEMU's `(qemu)` prompt) through QMP's
/// `human-monitor-command`; the text HMP printed.
pub fn hmp(vm: &mut Vm, line: &str) -> String {
    let cmd = serde_json::json!({
        "execute": "human-monitor-command",
        "arguments": { "command-line": line },
    });
    qmp_return(vm, &cmd.to_string())
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Polls `query-migrate` on `vm` until its migration has ended (completed, failed or
/// cancelled), up to 300 s: the last answer, or `Err` with the last answer on the time limit.
pub fn wait_migration(vm: &mut Vm) -> Result<Value, Value> {
    let t = Instant::now();
    loop {
        let q = qmp_return(vm, r#"{"execute":"query-migrate"}"#);
        if matches!(
            q["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return Ok(q);
        }
        if t.elapsed() >= Duration::from_secs(300) {
            return Err(q);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
