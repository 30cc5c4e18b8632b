//! The module layering `lib.rs` names is the one the code has: no module
//! imports from a module above it. Reads the sources, so a new upward
//! `use crate::…` fails here with the file and line that made it.

use std::path::Path;

/// Lowest first; a module may use only modules of a lower rank.
const LAYERS: &[&[&str]] = &[
    &["error", "text", "telemetry"],
    &["identity", "resilience", "fairness"],
    &["upstream"],
    &["health"],
    &["rag", "proxy", "jobs"],
    &["ratelimit"],
    &["config"],
    &["wiring"],
    &["http"],
    &["server"],
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_from_a_module_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut seen_modules = std::collections::BTreeSet::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        seen_modules.insert(module.clone());
        let own = rank(&module).unwrap_or_else(|| panic!("module `{module}` is not in LAYERS"));
        let text = std::fs::read_to_string(file).expect("readable");
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for (i, _) in line.match_indices("crate::") {
                let used: String = line[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if used == module || used.is_empty() {
                    continue;
                }
                match rank(&used) {
                    Some(r) if r < own => {}
                    _ => violations.push(format!(
                        "{}:{}: `{module}` uses `{used}`",
                        rel.display(),
                        n + 1
                    )),
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "upward imports:\n{}",
        violations.join("\n")
    );
    let listed: usize = LAYERS.iter().map(|l| l.len()).sum();
    assert_eq!(
        seen_modules.len(),
        listed,
        "every listed module exists: {seen_modules:?}"
    );
}
