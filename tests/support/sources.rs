//! The crate's source files, for tests that scan them (include it with
//! `#[path = "support/sources.rs"] mod sources;`).

use std::path::{Path, PathBuf};

/// Appends every `.rs` file under `dir` (recursively) to `out`; a missing or
/// unreadable directory adds nothing.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
