//! The `gmig` front door: help lists every subcommand, and exit codes are documented.

use std::process::Command;

fn gmig(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gmig"))
        .args(args)
        .output()
        .expect("gmig runs")
}

#[test]
fn help_lists_every_subcommand_and_exit_codes() {
    let out = gmig(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in ["decode", "replay", "migrate", "bench", "serve", "demo"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(sub)),
            "`gmig --help` does not list {sub}:\n{text}"
        );
    }
    assert!(
        text.contains("Exit codes"),
        "exit codes undocumented:\n{text}"
    );
}

#[test]
fn subcommand_help_describes_arguments() {
    for (sub, needle) in [
        ("decode", "--raw"),
        ("replay", "FIXTURE"),
        ("migrate", "--listen"),
        ("bench", "hash"),
        ("serve", "--socket"),
        ("demo", "--policy"),
    ] {
        let out = gmig(&[sub, "--help"]);
        assert!(out.status.success(), "gmig {sub} --help failed");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(needle),
            "gmig {sub} --help lacks {needle}:\n{text}"
        );
    }
}

#[test]
fn usage_errors_exit_with_code_2() {
    let out = gmig(&["no-such-subcommand"]);
    assert_eq!(out.status.code(), Some(2));
}
