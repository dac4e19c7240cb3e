//! Finding and running NVIDIA's `ptxas` for the PTX tests (include it with
//! `#[path = "support/ptxas.rs"] mod ptxas;`). ptxas is found through `VYRE_PTXAS`,
//! `PTXAS` or `PATH`; without it a test prints that it skipped, unless
//! `VYRE_REQUIRE_PTXAS=1` makes that a failure (CI sets it where ptxas is installed).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The ptxas binary, or `None` after printing that `test` is skipped. Panics (fails
/// the test) when `VYRE_REQUIRE_PTXAS=1` and none is found.
pub fn require(test: &str) -> Option<PathBuf> {
    let named = ["VYRE_PTXAS", "PTXAS"]
        .into_iter()
        .find_map(|variable| std::env::var_os(variable).filter(|p| !p.is_empty()))
        .map(PathBuf::from);
    let found = named.or_else(|| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|directory| directory.join("ptxas"))
                .find(|candidate| candidate.is_file())
        })
    });
    if found.is_none() {
        let required = std::env::var("VYRE_REQUIRE_PTXAS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "Fix: {test} needs ptxas (VYRE_REQUIRE_PTXAS=1): set VYRE_PTXAS to its path"
        );
        eprintln!("{test}: skipped: ptxas not found");
    }
    found
}

/// Assemble `ptx` for `sm_90` in a temporary directory. `Err` carries ptxas's
/// message and the PTX with line numbers.
pub fn assemble(ptxas: &Path, name: &str, ptx: &str) -> Result<(), String> {
    let directory = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let source = directory.path().join(format!("{name}.ptx"));
    let cubin = directory.path().join(format!("{name}.cubin"));
    std::fs::write(&source, ptx).map_err(|e| format!("write {}: {e}", source.display()))?;
    let output = Command::new(ptxas)
        .arg("-arch=sm_90")
        .arg(&source)
        .arg("-o")
        .arg(&cubin)
        .output()
        .map_err(|e| format!("run {}: {e}", ptxas.display()))?;
    if output.status.success() {
        return Ok(());
    }
    let mut report = format!("ptxas rejected {name}:\n");
    report.push_str(&String::from_utf8_lossy(&output.stderr));
    report.push_str(&String::from_utf8_lossy(&output.stdout));
    report.push_str("\n---- PTX ----\n");
    for (number, line) in ptx.lines().enumerate() {
        report.push_str(&format!("{:5} | {line}\n", number + 1));
    }
    Err(report)
}
