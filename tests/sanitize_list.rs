//! The compute-sanitizer script's inputs, checked on the CPU: `scripts/gpu-sanitize`
//! runs the tests `scripts/gpu-sanitize.list` names differently on the GPU machine
//! (`alone`: after the concurrent phase, nothing else on the GPU; `no-racecheck`:
//! skipped by racecheck; `no-memcheck`: skipped by memcheck; `unsanitized`: skipped
//! by every tool). A name that matches no test would silently send a renamed
//! test back into the concurrent phase, where its neighbours change its verdict, so
//! every name must be a `gpu_` test of this workspace; and the script must parse.

#[path = "support/sources.rs"]
mod sources;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The text of every `.rs` file under `dir`, recursively.
fn sources_under(dir: &Path, out: &mut String) {
    let mut files = Vec::new();
    sources::rust_files(dir, &mut files);
    for path in files {
        out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        out.push('\n');
    }
}

/// Every problem of a rules file (`RULE NAME` lines, `#` comments) against the test
/// sources: unknown rules, malformed lines, and names that are not a `gpu_` test
/// function in `sources`.
fn problems(list: &str, sources: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in list.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let [rule, name] = words[..] else {
            found.push(format!("line {}: `{line}` is not `RULE NAME`", number + 1));
            continue;
        };
        if !matches!(
            rule,
            "alone" | "no-racecheck" | "no-memcheck" | "unsanitized"
        ) {
            found.push(format!("line {}: unknown rule `{rule}`", number + 1));
        }
        if !name.starts_with("gpu_") || !sources.contains(&format!("fn {name}(")) {
            found.push(format!(
                "line {}: `{name}` is not a gpu_ test of this workspace",
                number + 1
            ));
        }
    }
    found
}

/// Locks out a rules file that names a test no binary holds (a renamed budget test
/// would run beside the other sanitizer jobs again and flip its verdict), an unknown
/// rule, or a script that no longer parses. Negative control: a made-up name, an
/// unknown rule and a line with three words are each reported.
#[test]
fn sanitize_rules_name_existing_gpu_tests_and_the_script_parses() {
    let mut sources = String::new();
    sources_under(&root().join("tests"), &mut sources);
    sources_under(&root().join("tokenizer/tests"), &mut sources);
    let list = std::fs::read_to_string(root().join("scripts/gpu-sanitize.list"))
        .expect("scripts/gpu-sanitize.list");
    assert_eq!(problems(&list, &sources), Vec::<String>::new());
    assert!(
        list.lines().any(|line| line.starts_with("alone ")),
        "no alone test"
    );

    let planted = "alone gpu_no_such_test\nsolo gpu_over_budget_dispatch_fails_before_allocating\n\
                   alone gpu_a gpu_b\n# alone gpu_commented_out\n";
    let reported = problems(planted, &sources);
    assert_eq!(reported.len(), 3, "{reported:?}");
    assert!(reported[0].contains("gpu_no_such_test"), "{reported:?}");
    assert!(reported[1].contains("unknown rule `solo`"), "{reported:?}");
    assert!(reported[2].contains("not `RULE NAME`"), "{reported:?}");

    let syntax = Command::new("bash")
        .arg("-n")
        .arg(root().join("scripts/gpu-sanitize"))
        .output()
        .expect("bash runs");
    assert!(
        syntax.status.success(),
        "bash -n scripts/gpu-sanitize: {}",
        String::from_utf8_lossy(&syntax.stderr)
    );
}
