//! Every relative link in the project's Markdown (README, CHANGELOG,
//! `docs/`, the crates' READMEs) names a file or directory that exists,
//! so a page moved or renamed never leaves a reader at a dead link.

use std::path::{Path, PathBuf};

/// Markdown files of the checkout, skipping build output and fuzz corpora.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | ".git" | "corpus" | "artifacts" | "node_modules"
            ) && !name.starts_with('.')
            {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The targets of inline links `[text](target)` outside code fences and
/// code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Drop code spans: a `[x](y)` inside backquotes is not a link.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].trim().to_string());
            rest = &after[end..];
        }
    }
    targets
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("docs/configuration.md")),
        "the walk found no docs/: {files:?}"
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("markdown is UTF-8");
        for target in link_targets(&text) {
            if target.is_empty()
                || target.starts_with('#')
                || target.contains("://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let path = target.split('#').next().unwrap_or_default();
            let path = path.split(' ').next().unwrap_or_default();
            let base = file.parent().unwrap_or(&root);
            checked += 1;
            if !base.join(path).exists() {
                broken.push(format!(
                    "{}: {target}",
                    file.strip_prefix(&root).unwrap_or(file).display()
                ));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} relative links found: is the reader broken?"
    );
    assert!(
        broken.is_empty(),
        "links that resolve to nothing:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_link_reader_skips_code_and_reads_links() {
    let text = "see [a](docs/a.md) and `[b](no.md)`\n```\n[c](no.md)\n```\n[d](x.md#part)";
    assert_eq!(link_targets(text), vec!["docs/a.md", "x.md#part"]);
}
