//! `cgpu-sim-stat`'s command line: help on stdout with exit 0, a usage error
//! naming what was wrong with exit 2.

use std::process::Command;

fn stat(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cgpu-sim-stat"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn help_goes_to_stdout_and_succeeds() {
    for h in ["--help", "-h"] {
        let o = stat(&[h]);
        assert_eq!(o.status.code(), Some(0), "{h}");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.starts_with("cgpu-sim-stat: "), "{out}");
        for opt in ["--state DIR", "--json", "--install-dir DIR", "--lib PATH"] {
            assert!(out.contains(opt), "{opt} in {out}");
        }
        assert!(o.stderr.is_empty());
    }
}

#[test]
fn usage_errors_name_the_option() {
    for (args, want) in [
        (&["--bogus"][..], "unknown option `--bogus`"),
        (&["--state"][..], "--state needs a value"),
        (&["--json", "extra"][..], "unknown option `extra`"),
    ] {
        let o = stat(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}
