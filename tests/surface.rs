//! The public surface is the product: `unsafe` code and raw driver
//! types (`cudarc::driver::sys`) may appear only in the files that own those
//! obligations. A scan of every source file of the crate enforces it, with
//! negative controls showing the scan catches what it must and ignores comments.

#[path = "support/sources.rs"]
mod sources;

use std::path::Path;

use sources::rust_files;

/// Files allowed to contain `unsafe` code, relative to the crate root, and why.
const UNSAFE_ALLOWED: &[&str] = &[
    // The raw driver layer: one checked function per driver call, by concern.
    "src/backend/driver/mod.rs",
    "src/backend/driver/context.rs",
    "src/backend/driver/memory.rs",
    "src/backend/driver/stream.rs",
    "src/backend/driver/module.rs",
    "src/backend/driver/graph.rs",
    "src/backend/driver/resident.rs",
    // The one description of stream operations and its targets (forwarded obligations).
    "src/backend/stream_ops.rs",
    // The dispatch path's enqueue and the blocking buffer transfers: descriptions
    // enqueued over memory they keep alive until the synchronize.
    "src/backend/dispatch/stage.rs",
    "src/backend/dispatch/transfer.rs",
    // The raw-driver floor benches compare against (test support).
    "src/backend/floor.rs",
    // Result areas: the device fill and copy that clear and bring back a
    // device-memory area (no host mapping), over memory the area owns.
    "src/backend/readback.rs",
    // Lanes: the server kernel's launch over memory the lane owns until its kernel
    // stopped (`lane/mod.rs`), and the host-mapped memory shared with the running
    // kernel, touched only through atomics and volatile copies (`lane/mapped.rs`).
    "src/backend/lane/mod.rs",
    "src/backend/lane/mapped.rs",
    // Owned buffers: the host's atomic view of a host-mapped buffer (`host_words`),
    // kept apart from the plain views by this type's own borrows.
    "src/backend/buffer.rs",
    // The CPU's cache hint (`cldemote`) over host memory a borrow keeps mapped,
    // which it neither reads nor writes.
    "src/backend/host_cache.rs",
    // Graph capture, replay and kernel-node updates.
    "src/backend/graph/mod.rs",
    "src/backend/graph/record.rs",
    // Stitched parents: copy nodes, child-node updates and the parent's launch.
    "src/backend/graph/stitch.rs",
    // A counting global allocator (the zero-allocation test).
    "tests/gpu_zero_alloc.rs",
    // The measuring thread's CPU clock (`clock_gettime`), the in-region fallback for
    // run-queue delay where schedstat is missing.
    "src/host_cost/clock.rs",
    // CPU affinity (`sched_{get,set}affinity`, `sched_getcpu`) to pin a competing
    // thread onto the measuring thread's CPU (planted interference).
    "tests/affinity/mod.rs",
];

/// Files allowed to name cudarc at all.
const CUDARC_ALLOWED: &[&str] = &[
    "src/backend/driver/mod.rs",
    "src/backend/driver/context.rs",
    "src/backend/driver/memory.rs",
    "src/backend/driver/stream.rs",
    "src/backend/driver/module.rs",
    "src/backend/driver/graph.rs",
    "src/backend/driver/resident.rs",
];

/// The source with comments, string and char literals blanked out (so a word in
/// a doc comment or a message is not code). Handles line, block and nested block
/// comments, plain and raw strings; good enough for this crate's sources.
fn code_only(source: &str) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &source[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').map_or(bytes.len(), |n| i + n);
            i = end;
        } else if rest.starts_with("/*") {
            let mut depth = 0;
            while i < bytes.len() {
                if source[i..].starts_with("/*") {
                    depth += 1;
                    i += 2;
                } else if source[i..].starts_with("*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].bytes().take_while(|&b| b == b'#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = i + 2 + hashes;
            i = source[body..]
                .find(&close)
                .map_or(bytes.len(), |n| body + n + close.len());
            out.push_str("\"\"");
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if bytes[i] == b'\''
            && rest.len() >= 3
            && (rest.as_bytes()[2] == b'\'' || rest.as_bytes()[1] == b'\\')
        {
            // A char literal ('x' or '\n'); lifetimes ('a) are left alone.
            let end = rest[1..].find('\'').map_or(bytes.len(), |n| i + 1 + n + 1);
            i = end;
            out.push_str("' '");
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn has_word(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// Every violation in one file: `unsafe` outside the allowed files, cudarc
/// outside the driver layer.
fn violations(path: &str, source: &str) -> Vec<String> {
    let code = code_only(source);
    let mut found = Vec::new();
    if has_word(&code, "unsafe") && !UNSAFE_ALLOWED.contains(&path) {
        found.push(format!("{path}: `unsafe` outside the allowed files"));
    }
    if has_word(&code, "cudarc") && !CUDARC_ALLOWED.contains(&path) {
        found.push(format!(
            "{path}: cudarc (raw driver types) outside src/backend/driver/"
        ));
    }
    found
}

/// Locks out `unsafe` code and raw driver types leaking out of the files that own
/// their obligations (a new `unsafe` block in, say, `backend/pool.rs`, or a
/// `cudarc::driver::sys` type in a public signature elsewhere).
#[test]
fn unsafe_and_raw_driver_types_stay_in_their_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches", "examples"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 40, "found only {} source files", files.len());
    let mut all = Vec::new();
    let mut seen_unsafe = 0;
    for file in &files {
        let relative = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let source = std::fs::read_to_string(file).unwrap();
        if has_word(&code_only(&source), "unsafe") {
            seen_unsafe += 1;
        }
        all.extend(violations(&relative, &source));
    }
    assert!(
        seen_unsafe >= 4,
        "the scan saw unsafe in only {seen_unsafe} files"
    );
    assert!(all.is_empty(), "{}", all.join("\n"));
}

/// Negative control: the scan flags `unsafe` and cudarc in a file that may not hold
/// them, and ignores the words in comments, doc comments and strings.
#[test]
fn the_scan_catches_violations_and_ignores_comments() {
    let bad = "fn f(p: *const u8) -> u8 {\n    unsafe { *p }\n}\nuse cudarc::driver::sys;\n";
    let found = violations("src/backend/pool.rs", bad);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(violations("src/backend/driver/memory.rs", bad).is_empty());
    let harmless = "//! unsafe cudarc\n/// `unsafe fn` docs\n/* unsafe /* nested */ cudarc */\n\
                    fn f() -> &'static str { let _c = '\"'; \"unsafe cudarc\" }\n\
                    fn g() -> &'static str { r#\"unsafe \"quoted\" cudarc\"# }\nfn unsafely() {}\n";
    assert!(
        violations("src/backend/pool.rs", harmless).is_empty(),
        "{:?}\n{}",
        violations("src/backend/pool.rs", harmless),
        code_only(harmless)
    );
}
