//! The configuration reference (`docs/configuration.md`) names every key a
//! node's or a relay's `config.toml` may hold: each field of a
//! `Deserialize` struct in the config sources must have a table row
//! `` | `key` | `` there. A key added without documentation fails here.

use std::collections::BTreeSet;
use std::path::Path;

/// The sources whose `Deserialize` structs are `config.toml` files.
const CONFIG_SOURCES: &[&str] = &["src/config/file.rs", "src/cmd/relay.rs"];

/// Field names (after `rename`) of every struct deriving `Deserialize`
/// in `source`, except `#[serde(transparent)]` newtypes.
fn deserialized_fields(source: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let lines: Vec<&str> = source.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.starts_with("#[derive(") && line.contains("Deserialize") {
            // Attributes up to the `struct` line.
            let mut j = i + 1;
            let mut transparent = false;
            while j < lines.len() && !lines[j].contains("struct ") && !lines[j].contains("enum ") {
                transparent |= lines[j].contains("transparent");
                j += 1;
            }
            let is_struct = j < lines.len()
                && lines[j].contains("struct ")
                && lines[j].trim_end().ends_with('{');
            if is_struct && !transparent {
                let mut rename: Option<String> = None;
                let mut skip = false;
                j += 1;
                while j < lines.len() && lines[j].trim() != "}" {
                    let l = lines[j].trim();
                    if l.starts_with("#[serde(") {
                        if let Some(at) = l.find("rename = \"") {
                            let rest = &l[at + 10..];
                            rename = rest.split('"').next().map(str::to_string);
                        }
                        skip |= l.contains("skip)")
                            || l.contains("skip,")
                            || l.contains("skip_deserializing");
                    } else if !l.starts_with("//") && !l.starts_with("#[") {
                        let l = l
                            .trim_start_matches("pub(crate) ")
                            .trim_start_matches("pub ");
                        if let Some((name, _)) = l.split_once(':') {
                            if !skip && !name.contains(' ') && !name.is_empty() {
                                keys.insert(rename.take().unwrap_or_else(|| name.to_string()));
                            }
                        }
                        rename = None;
                        skip = false;
                    }
                    j += 1;
                }
            }
            i = j;
        }
        i += 1;
    }
    keys
}

#[test]
fn every_config_key_has_a_row_in_the_configuration_reference() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let reference = std::fs::read_to_string(crate_dir.join("../docs/configuration.md"))
        .expect("docs/configuration.md is readable");
    let mut keys = BTreeSet::new();
    for source in CONFIG_SOURCES {
        let text = std::fs::read_to_string(crate_dir.join(source)).expect("config source");
        keys.extend(deserialized_fields(&text));
    }
    // The reader found the keys it must: a parser that finds nothing would
    // pass vacuously.
    for known in [
        "agent",
        "listen",
        "postgres_url",
        "plain_http_loopback",
        "fingerprint",
        "via",
        "total_bytes",
    ] {
        assert!(
            keys.contains(known),
            "the test no longer finds `{known}` in the config sources: {keys:?}"
        );
    }
    let missing: Vec<_> = keys
        .iter()
        .filter(|k| !reference.contains(&format!("| `{k}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "config keys without a row in docs/configuration.md: {missing:?}"
    );
}
