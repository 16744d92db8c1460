//! Each crate's module graph has no circle, and each layer uses only the layers below it: the
//! library's (`src/`), the command's (`cli/src/`) and the CNI plugin's (`cni/src/`).
//!
//! Every `crate::<module>` path in a crate's code (comments and doc links left out) is an
//! edge from the top-level module of the file it appears in to `<module>`. The test fails
//! with the offending edges if a module reaches one above it, which is what an import circle
//! needs.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may use its own layer's modules only where listed in
/// `SAME_LAYER` (so that no two can use each other), and any module of a lower layer.
const LAYERS: &[&[&str]] = &[
    &["narrow"],
    &["stats", "time", "sys", "hash"],
    &["base"],
    &["wire"],
    &["buf"],
    &["offload"],
    &["port", "l2", "l3", "conntrack"],
    &["nat"],
    &["datapath"],
    &["runtime"],
];

/// Edges allowed inside one layer (from, to).
const SAME_LAYER: &[(&str, &str)] = &[
    // The clock reads CLOCK_MONOTONIC through the syscall module.
    ("time", "sys"),
];

/// The command's layers (`cli/src/`, the `tapyard_cli` library), lowest first: the parts of
/// a node, then what runs them.
const CLI_LAYERS: &[&[&str]] = &[
    &["args", "failpoint", "capture"],
    &["config"],
    &["state"],
    &["ports"],
    &["node"],
    &["control"],
    &["metrics", "takeover"],
    &["supervisor"],
    &["commands"],
];

/// The CNI plugin's layers (`cni/src/`), lowest first.
const CNI_LAYERS: &[&[&str]] = &[
    &["error", "types"],
    &["args", "config", "control", "netlink", "netns"],
    &["ipam"],
    &["plugin"],
];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for the crate roots `lib.rs`
/// and `main.rs`).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if first == "lib.rs" || first == "main.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// The modules named as `crate::<name>` in code (not in comments).
fn uses(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                out.insert(name);
            }
        }
    }
    out
}

fn layer_of(layers: &[&[&str]], m: &str) -> Option<usize> {
    layers.iter().position(|l| l.contains(&m))
}

/// The edges of the crate in `src` that break its `layers` (`same` lists the edges allowed
/// inside one layer), and its graph.
fn check(
    src: &Path,
    layers: &[&[&str]],
    same: &[(&str, &str)],
) -> (Vec<String>, BTreeMap<String, BTreeSet<String>>) {
    let mut files = Vec::new();
    rs_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let Some(from) = top_module(src, f) else {
            continue;
        };
        let text = fs::read_to_string(f).unwrap();
        for to in uses(&text) {
            if to != from {
                graph.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    let mut bad = Vec::new();
    for (from, tos) in &graph {
        let Some(lf) = layer_of(layers, from) else {
            bad.push(format!("{from}: not in any layer (add it to LAYERS)"));
            continue;
        };
        for to in tos {
            let Some(lt) = layer_of(layers, to) else {
                // Re-exports at the crate root (`crate::MacAddr`) are types, not modules.
                continue;
            };
            let ok = lt < lf || (lt == lf && same.contains(&(from.as_str(), to.as_str())));
            if !ok {
                bad.push(format!("{from} -> {to}"));
            }
        }
    }
    (bad, graph)
}

/// Checks the crate whose `src` directory is `dir` (relative to the workspace root).
fn assert_layered(dir: &str, layers: &[&[&str]], same: &[(&str, &str)]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let (bad, graph) = check(&src, layers, same);
    assert!(
        bad.is_empty(),
        "{dir}: modules reaching their own or a higher layer (a circle in the making):\n{}\ngraph: {graph:#?}",
        bad.join("\n")
    );
}

#[test]
fn modules_form_layers_without_a_circle() {
    assert_layered("src", LAYERS, SAME_LAYER);
}

#[test]
fn the_command_s_modules_form_layers_without_a_circle() {
    assert_layered("cli/src", CLI_LAYERS, &[]);
}

#[test]
fn the_cni_plugin_s_modules_form_layers_without_a_circle() {
    assert_layered("cni/src", CNI_LAYERS, &[]);
}

/// A circle between two modules is caught, whichever layer each is put in.
#[test]
fn a_circle_fails_the_check() {
    let dir = std::env::temp_dir().join(format!("tapyard-layers-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("b")).unwrap();
    fs::write(dir.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    fs::write(dir.join("a.rs"), "use crate::b::B;\n").unwrap();
    fs::write(dir.join("b/mod.rs"), "mod c;\n").unwrap();
    fs::write(dir.join("b/c.rs"), "use crate::a::A;\n").unwrap();
    for layers in [
        &[&["a"][..], &["b"][..]][..],
        &[&["b"], &["a"]],
        &[&["a", "b"]],
    ] {
        let (bad, _) = check(&dir, layers, &[]);
        assert!(!bad.is_empty(), "{layers:?}");
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn the_check_sees_code_not_comments() {
    let u = uses(
        "use crate::wire::ipv4; // see crate::datapath\n/// [`crate::nat`]\nx = crate::MacAddr;",
    );
    assert_eq!(u.into_iter().collect::<Vec<_>>(), vec!["wire".to_string()]);
}
