//! Finding and running NVIDIA's `ptxas` (and `nvdisasm`, for the tests that read
//! the SASS ptxas made) for the PTX tests (include it with
//! `#[path = "support/ptxas.rs"] mod ptxas;`). ptxas is found through `VYRE_PTXAS`,
//! `PTXAS`, `PATH`, a `.venv-ptxas` in the repository or the `nvidia-cuda-nvcc`
//! Python package, nvdisasm the same way (`VYRE_NVDISASM`, `NVDISASM`, the
//! `nvidia-cuda-nvdisasm` package); without one a test prints that it skipped, unless
//! `VYRE_REQUIRE_PTXAS=1` makes that a failure (CI sets it where both are installed).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A tool of NVIDIA's that the PTX tests run: where to look for it.
struct Tool {
    /// Its file name.
    name: &'static str,
    /// Variables that name its path, the first set one wins.
    variables: [&'static str; 2],
    /// The directory under `site-packages/nvidia/` whose `bin/` holds it (its
    /// Python package's).
    package: &'static str,
    /// How the CI script installs it.
    install: &'static str,
}

const PTXAS: Tool = Tool {
    name: "ptxas",
    variables: ["VYRE_PTXAS", "PTXAS"],
    package: "cuda_nvcc",
    install: "`python3 -m venv .venv-ptxas && .venv-ptxas/bin/pip install nvidia-cuda-nvcc-cu12`",
};

const NVDISASM: Tool = Tool {
    name: "nvdisasm",
    variables: ["VYRE_NVDISASM", "NVDISASM"],
    package: "cu13",
    install: "`.venv-ptxas/bin/pip install nvidia-cuda-nvdisasm` (see .ci/run)",
};

/// The ptxas binary, searched once per test process.
pub fn find() -> Option<PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND.get_or_init(|| search(&PTXAS)).clone()
}

/// The nvdisasm binary (SASS from a cubin), searched once per test process.
pub fn find_nvdisasm() -> Option<PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND.get_or_init(|| search(&NVDISASM)).clone()
}

fn search(tool: &Tool) -> Option<PathBuf> {
    for variable in tool.variables {
        if let Some(path) = std::env::var_os(variable).filter(|p| !p.is_empty()) {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "Fix: {variable} is set to {}, which is not a file; point it at a {} binary or unset it",
                path.display(),
                tool.name
            );
            return Some(path);
        }
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for directory in std::env::split_paths(&paths) {
            let candidate = directory.join(tool.name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    let in_package = format!("nvidia/{}/bin/{}", tool.package, tool.name);
    let venv_lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-ptxas/lib");
    if let Ok(entries) = std::fs::read_dir(&venv_lib) {
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for python in pythons {
            let candidate = python.join("site-packages").join(&in_package);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    let output = Command::new("python3")
        .args([
            "-c",
            "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))",
        ])
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let site_packages = String::from_utf8(output.stdout).ok()?;
    let candidate = PathBuf::from(site_packages.trim()).join(&in_package);
    candidate.is_file().then_some(candidate)
}

/// The ptxas binary, or `None` after printing that the caller is skipped.
/// Panics (fails the test) when `VYRE_REQUIRE_PTXAS=1` and none is found.
pub fn require(test: &str) -> Option<PathBuf> {
    require_tool(test, &PTXAS, find())
}

/// The nvdisasm binary, as [`require`] finds ptxas (`VYRE_REQUIRE_PTXAS=1` asks
/// for both).
pub fn require_nvdisasm(test: &str) -> Option<PathBuf> {
    require_tool(test, &NVDISASM, find_nvdisasm())
}

fn require_tool(test: &str, tool: &Tool, found: Option<PathBuf>) -> Option<PathBuf> {
    if found.is_none() {
        let required = std::env::var("VYRE_REQUIRE_PTXAS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "Fix: {test} needs {} (VYRE_REQUIRE_PTXAS=1): install it with {} or set {} to its path",
            tool.name, tool.install, tool.variables[0]
        );
        eprintln!("{test}: skipped: {} not found", tool.name);
    }
    found
}

/// Assemble one module for `sm_90`. The error shows ptxas's message and the PTX
/// with line numbers.
pub fn assemble(ptxas: &Path, name: &str, ptx: &str) -> Result<(), String> {
    let directory = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    assemble_in(ptxas, directory.path(), name, ptx)
}

/// [`assemble`] every `(name, ptx)` module; `Err` with every failure's report, one
/// after another, so that one run shows all of them.
pub fn assemble_all<'a, Ptx: AsRef<str>>(
    ptxas: &Path,
    modules: impl IntoIterator<Item = (&'a str, Ptx)>,
) -> Result<(), String> {
    let failures: Vec<String> = modules
        .into_iter()
        .filter_map(|(name, ptx)| assemble(ptxas, name, ptx.as_ref()).err())
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n\n"))
    }
}

/// [`assemble`], writing `<name>.ptx` into an existing directory.
pub fn assemble_in(ptxas: &Path, directory: &Path, name: &str, ptx: &str) -> Result<(), String> {
    let cubin = cubin_in(ptxas, directory, name, ptx)?;
    let _ = std::fs::remove_file(&cubin);
    Ok(())
}

/// Write `<name>.ptx` into `directory` and assemble it for `sm_90` into
/// `<name>.cubin` there, whose path it returns. The error shows ptxas's message
/// and the PTX with line numbers.
fn cubin_in(ptxas: &Path, directory: &Path, name: &str, ptx: &str) -> Result<PathBuf, String> {
    let source = directory.join(format!("{name}.ptx"));
    let cubin = directory.join(format!("{name}.cubin"));
    std::fs::write(&source, ptx).map_err(|e| format!("write {}: {e}", source.display()))?;
    let output = Command::new(ptxas)
        .arg("-arch=sm_90")
        .arg(&source)
        .arg("-o")
        .arg(&cubin)
        .output()
        .map_err(|e| format!("run {}: {e}", ptxas.display()))?;
    if output.status.success() {
        return Ok(cubin);
    }
    let _ = std::fs::remove_file(&cubin);
    let mut report = format!("ptxas rejected {name}:\n");
    report.push_str(&String::from_utf8_lossy(&output.stderr));
    report.push_str(&String::from_utf8_lossy(&output.stdout));
    report.push_str("\n---- PTX ----\n");
    for (number, line) in ptx.lines().enumerate() {
        report.push_str(&format!("{:5} | {line}\n", number + 1));
    }
    Err(report)
}

/// Assemble one module for `sm_90` and disassemble its cubin with nvdisasm: the
/// SASS instructions, one per line, without their addresses and encodings.
pub fn disassemble(ptxas: &Path, nvdisasm: &Path, name: &str, ptx: &str) -> Result<String, String> {
    let directory = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let cubin = cubin_in(ptxas, directory.path(), name, ptx)?;
    let listed = Command::new(nvdisasm)
        .arg("-c")
        .arg(&cubin)
        .output()
        .map_err(|e| format!("run {}: {e}", nvdisasm.display()))?;
    if !listed.status.success() {
        return Err(format!(
            "nvdisasm failed on {name}:\n{}",
            String::from_utf8_lossy(&listed.stderr)
        ));
    }
    // Instruction lines look like `        /*0070*/   @P0 EXIT ;`.
    let sass = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("/*")?;
            let (address, instruction) = rest.split_once("*/")?;
            address
                .chars()
                .all(|c| c.is_ascii_hexdigit())
                .then(|| instruction.trim().to_owned())
        })
        .collect::<Vec<_>>()
        .join("\n");
    Ok(sass)
}

/// What `ptxas -v` reports for one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resources {
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores.
    pub spill_store_bytes: u32,
    /// Bytes of spill loads.
    pub spill_load_bytes: u32,
}

/// Assemble one single-kernel module for `sm_90` with `-v` and read its register
/// and spill counts (ptxas's `Used N registers` and `N bytes spill stores/loads`).
/// A warning (for example a dropped `.minnctapersm`) is an error too.
pub fn resources(ptxas: &Path, name: &str, ptx: &str) -> Result<Resources, String> {
    let directory = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let source = directory.path().join(format!("{name}.ptx"));
    std::fs::write(&source, ptx).map_err(|e| format!("write {}: {e}", source.display()))?;
    let output = Command::new(ptxas)
        .arg("-arch=sm_90")
        .arg("-v")
        .arg(&source)
        .arg("-o")
        .arg(directory.path().join(format!("{name}.cubin")))
        .output()
        .map_err(|e| format!("run {}: {e}", ptxas.display()))?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    if !output.status.success() || report.contains("warning") {
        return Err(format!("ptxas on {name}:\n{report}"));
    }
    // The number just before `suffix` on the line that has it.
    let number_before = |suffix: &str| -> Option<u32> {
        let line = report.lines().find(|line| line.contains(suffix))?;
        let head = &line[..line.find(suffix)?];
        head.split_whitespace().last()?.parse().ok()
    };
    let missing = || format!("ptxas -v on {name} printed no usage line:\n{report}");
    Ok(Resources {
        registers: number_before(" registers").ok_or_else(missing)?,
        spill_store_bytes: number_before(" bytes spill stores").ok_or_else(missing)?,
        spill_load_bytes: number_before(" bytes spill loads").ok_or_else(missing)?,
    })
}
