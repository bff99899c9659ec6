//! The layering, checked rather than drawn (docs/ARCHITECTURE.md):
//! - every crate of the workspace has a layer, and depends only on crates of lower layers
//!   (`cargo metadata`: normal, build and dev dependencies);
//! - what a layer must never link, through any path of normal dependencies: no HTTP server
//!   framework (axum) below the node, no HTTP at all in the engine, no runtime (tokio) and
//!   no I/O client in the wire contract or the formats, no RocksDB in the clients;
//! - no import cycle between the modules of a crate, at its top level and among the
//!   children of every module with a directory (`crate::path::m` paths, and `super::m` in
//!   a module's own file, outside comments; what a module takes from its parent is no
//!   edge);
//! - the top level is the design card's (`api/`, `appliance/`, `firmware-sim/`, `helm/`,
//!   `docs/`, and beside them only bench/, scripts/, examples/), every crate lives in one of
//!   the first three, and dependencies point one way: api ← appliance → firmware-sim.
//!
//! Each rule is run over the real workspace and over a small made-up one that breaks it, so
//! a rule that can no longer fail is noticed.

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each crate's layer: a crate may depend on crates of lower layers only.
const LAYERS: &[(&str, u8)] = &[
    ("ctxpod-wire", 0),
    ("ctxpod-format", 1),
    ("ctxpod-plan", 1),
    ("ctxpod-firmware-sim", 1),
    ("ctxpod-client", 2),
    ("ctxpod-engine", 2),
    ("ctxpod-pod", 3),
    ("ctxpod-testkit", 3),
    ("ctxpod-node", 4),
    ("ctxpod-tools", 4),
    ("ctxpod-python", 4),
    ("ctxpod-sim", 4),
    ("ctxpod", 5),
];

/// Dependency edges the [`NEVER`] check does not follow: `etcd-client` takes `tonic` with
/// its default features, whose `router` (a gRPC *server*'s router) links axum; the pod uses
/// tonic's client only, and nothing of ours may name tonic's router.
const NOT_FOLLOWED: &[(&str, &str)] = &[("tonic", "axum")];

/// Packages a crate must not reach through normal dependencies.
const NEVER: &[(&str, &[&str])] = &[
    (
        "ctxpod-wire",
        &["tokio", "reqwest", "axum", "hyper", "rocksdb"],
    ),
    (
        "ctxpod-format",
        &["tokio", "reqwest", "axum", "hyper", "rocksdb"],
    ),
    ("ctxpod-plan", &["tokio", "reqwest", "axum", "rocksdb"]),
    ("ctxpod-client", &["axum", "rocksdb", "librocksdb-sys"]),
    ("ctxpod-engine", &["axum", "reqwest", "hyper"]),
    ("ctxpod-pod", &["axum"]),
    ("ctxpod-testkit", &["axum", "rocksdb"]),
    ("ctxpod-tools", &["axum"]),
    // The simulation runs the pod's code without its servers or the node.
    ("ctxpod-sim", &["axum", "ctxpod-node"]),
    (
        "ctxpod-python",
        &["axum", "rocksdb", "ctxpod-engine", "ctxpod-node"],
    ),
];

/// The workspace's root: this crate is `appliance/cli`.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace root")
        .to_path_buf()
}

/// The host's target triple (what the build resolved dependencies for).
fn host() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = std::process::Command::new(rustc)
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// `cargo metadata` of the workspace: with the dependency graph resolved for the host
/// (what is built here, all of it already downloaded), or only the workspace's packages.
fn metadata_of(graph: bool) -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args([
        "metadata",
        "--format-version",
        "1",
        "--offline",
        "--manifest-path",
    ])
    .arg(workspace_root().join("Cargo.toml"));
    if graph {
        cmd.args(["--filter-platform", &host()]);
    } else {
        cmd.arg("--no-deps");
    }
    let out = cmd.output().expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata answers JSON")
}

/// Every breach of the layering in `meta` (the output of `cargo metadata`).
fn violations(meta: &Value) -> Vec<String> {
    let layer: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut out = Vec::new();
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let name_of: BTreeMap<&str, &str> = packages
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap_or(""),
                p["name"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let workspace: BTreeSet<&str> = members.iter().map(|id| name_of[id]).collect();
    for name in &workspace {
        let Some(&mine) = layer.get(name) else {
            out.push(format!("{name} has no layer in LAYERS"));
            continue;
        };
        let package = packages
            .iter()
            .find(|p| p["name"] == *name)
            .expect("a member's package");
        for d in package["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or("");
            if !workspace.contains(dep) {
                continue;
            }
            match layer.get(dep) {
                Some(&theirs) if theirs < mine => {}
                Some(&theirs) => out.push(format!(
                    "{name} (layer {mine}) depends on {dep} (layer {theirs}), not below it"
                )),
                None => {}
            }
        }
    }
    // Reachability over normal dependencies of the resolved graph.
    let nodes: BTreeMap<&str, Vec<&str>> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve.nodes")
        .iter()
        .map(|n| {
            let deps = n["deps"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|k| k["kind"].is_null())
                })
                .filter_map(|d| d["pkg"].as_str())
                .collect();
            (n["id"].as_str().unwrap_or(""), deps)
        })
        .collect();
    for (crate_name, never) in NEVER {
        let Some(start) = members.iter().find(|id| name_of[*id] == *crate_name) else {
            out.push(format!("{crate_name} is not in the workspace"));
            continue;
        };
        // Every package reached, with the one it was reached from.
        let mut via: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = vec![*start];
        while let Some(id) = queue.pop() {
            for &next in nodes.get(id).into_iter().flatten() {
                let edge = (
                    name_of.get(id).copied().unwrap_or(id),
                    name_of.get(next).copied().unwrap_or(next),
                );
                if NOT_FOLLOWED.contains(&edge) {
                    continue;
                }
                if next != *start && !via.contains_key(next) {
                    via.insert(next, id);
                    queue.push(next);
                }
            }
        }
        for (&id, _) in via.iter() {
            let name = name_of.get(id).copied().unwrap_or(id);
            if never.contains(&name) {
                let mut path = vec![name];
                let mut at = id;
                while let Some(&from) = via.get(at) {
                    path.push(name_of.get(from).copied().unwrap_or(from));
                    at = from;
                }
                path.reverse();
                out.push(format!("{crate_name} links {name}: {}", path.join(" -> ")));
            }
        }
    }
    out
}

#[test]
fn every_crate_depends_only_on_the_layers_below() {
    let v = violations(&metadata_of(true));
    assert!(v.is_empty(), "the layering is broken:\n{}", v.join("\n"));
}

#[test]
fn the_layering_check_catches_an_upward_edge_and_a_forbidden_link() {
    // engine -> node (upward) and pod -> axum (a server below the node).
    let meta = json!({
        "workspace_members": ["e", "n", "p"],
        "packages": [
            {"id": "e", "name": "ctxpod-engine", "dependencies": [{"name": "ctxpod-node"}]},
            {"id": "n", "name": "ctxpod-node", "dependencies": []},
            {"id": "p", "name": "ctxpod-pod", "dependencies": [{"name": "ctxpod-engine"}]},
            {"id": "a", "name": "axum", "dependencies": []},
        ],
        "resolve": {"nodes": [
            {"id": "e", "deps": []},
            {"id": "n", "deps": []},
            {"id": "p", "deps": [
                {"pkg": "e", "dep_kinds": [{"kind": null}]},
                {"pkg": "a", "dep_kinds": [{"kind": null}]},
            ]},
            {"id": "a", "deps": []},
        ]},
    });
    let v = violations(&meta);
    assert!(
        v.iter()
            .any(|m| m.contains("ctxpod-engine (layer 2) depends on ctxpod-node")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|m| m == "ctxpod-pod links axum: ctxpod-pod -> axum"),
        "{v:?}"
    );
}

#[test]
fn axum_through_tonics_router_is_not_a_forbidden_link_but_any_other_path_is() {
    // pod -> tonic -> axum (tonic's default router, for a gRPC server): not followed;
    // sim -> hyper-ish -> axum: a forbidden link still.
    let meta = json!({
        "workspace_members": ["p", "s"],
        "packages": [
            {"id": "p", "name": "ctxpod-pod", "dependencies": []},
            {"id": "s", "name": "ctxpod-sim", "dependencies": []},
            {"id": "t", "name": "tonic", "dependencies": []},
            {"id": "o", "name": "other", "dependencies": []},
            {"id": "a", "name": "axum", "dependencies": []},
        ],
        "resolve": {"nodes": [
            {"id": "p", "deps": [{"pkg": "t", "dep_kinds": [{"kind": null}]}]},
            {"id": "s", "deps": [{"pkg": "o", "dep_kinds": [{"kind": null}]}]},
            {"id": "t", "deps": [{"pkg": "a", "dep_kinds": [{"kind": null}]}]},
            {"id": "o", "deps": [{"pkg": "a", "dep_kinds": [{"kind": null}]}]},
            {"id": "a", "deps": []},
        ]},
    });
    let v = violations(&meta);
    assert!(
        !v.iter().any(|m| m.starts_with("ctxpod-pod links")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|m| m == "ctxpod-sim links axum: ctxpod-sim -> other -> axum"),
        "{v:?}"
    );
}

/// The top-level modules of the crate in `src` and the ones each refers to.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    module_graph_at(src, "")
}

/// The modules declared in directory `dir` (the module at `path`, `""` for the crate's
/// root: `src`) and which of their siblings each refers to: `crate::<path>::m` paths
/// anywhere in a module's files, and `super::m` in its own file (where `super` is the
/// module at `path`), outside comments. References to the parent itself are not edges:
/// a module may use what its parent declares.
fn module_graph_at(dir: &Path, path: &str) -> BTreeMap<String, BTreeSet<String>> {
    let files = module_files(dir);
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    let absolute = if path.is_empty() {
        "crate::".to_string()
    } else {
        format!("crate::{path}::")
    };
    let mut graph = BTreeMap::new();
    for (m, fs) in &files {
        let mut refs = BTreeSet::new();
        for (f, top) in fs {
            let text = std::fs::read_to_string(f).expect("read a source file");
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                let mut prefixes = vec![absolute.as_str()];
                if *top {
                    prefixes.push("super::");
                }
                for prefix in prefixes {
                    for (i, _) in line.match_indices(prefix) {
                        let before = line[..i].chars().next_back();
                        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                            continue;
                        }
                        let rest = &line[i + prefix.len()..];
                        let name: String = rest
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if name != *m && modules.contains(&name) {
                            refs.insert(name);
                        }
                    }
                }
            }
        }
        graph.insert(m.clone(), refs);
    }
    graph
}

/// The modules declared in `dir` (`m.rs`, `m/`, or both), each with its files and whether
/// each is the module's own file (`m.rs`, `m/mod.rs`) rather than one of its submodules'.
fn module_files(dir: &Path) -> BTreeMap<String, Vec<(PathBuf, bool)>> {
    let mut files: BTreeMap<String, Vec<(PathBuf, bool)>> = BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("read src").flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(m) = name.strip_suffix(".rs") {
            if !["lib", "main", "mod"].contains(&m) {
                files.entry(m.to_string()).or_default().push((p, true));
            }
        } else if p.is_dir() {
            let mut stack = vec![p.clone()];
            while let Some(d) = stack.pop() {
                for f in std::fs::read_dir(&d).expect("read dir").flatten() {
                    let fp = f.path();
                    if fp.is_dir() {
                        stack.push(fp);
                    } else if fp.extension().is_some_and(|x| x == "rs") {
                        let top = fp == p.join("mod.rs");
                        files.entry(name.clone()).or_default().push((fp, top));
                    }
                }
            }
        }
    }
    files
}

/// Every module graph of the crate in `src`: its top level, and the children of each
/// module that has a directory, at every depth; by the module's path.
fn module_graphs(src: &Path) -> Vec<(String, BTreeMap<String, BTreeSet<String>>)> {
    let mut out = Vec::new();
    let mut todo = vec![(src.to_path_buf(), String::new())];
    while let Some((dir, path)) = todo.pop() {
        for e in std::fs::read_dir(&dir).expect("read dir").flatten() {
            if e.path().is_dir() {
                let name = e.file_name().to_string_lossy().to_string();
                let child = if path.is_empty() {
                    name
                } else {
                    format!("{path}::{name}")
                };
                todo.push((e.path(), child));
            }
        }
        out.push((path.clone(), module_graph_at(&dir, &path)));
    }
    out
}

/// A cycle in `graph`, as the modules along it, if there is one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let root = workspace_root();
    let meta = metadata_of(false);
    let mut found = Vec::new();
    let mut crates = 0;
    for p in meta["packages"].as_array().expect("packages") {
        let manifest = PathBuf::from(p["manifest_path"].as_str().unwrap_or(""));
        if !manifest.starts_with(&root) {
            continue;
        }
        let src = manifest.parent().expect("a crate's directory").join("src");
        crates += 1;
        for (path, g) in module_graphs(&src) {
            if let Some(c) = cycle(&g) {
                let at = if path.is_empty() { "crate" } else { &path };
                found.push(format!("{} ({at}): {}", p["name"], c.join(" -> ")));
            }
        }
    }
    assert!(crates >= LAYERS.len(), "looked at {crates} crates");
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn the_cycle_check_finds_a_cycle_through_three_modules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;").expect("write");
    std::fs::write(
        src.join("a.rs"),
        "use crate::b::X;\n// crate::c in a comment",
    )
    .expect("write");
    std::fs::create_dir(src.join("b")).expect("mkdir");
    std::fs::write(src.join("b/mod.rs"), "use super::c::Y;").expect("write");
    std::fs::write(src.join("c.rs"), "fn f() { crate::a::g() }").expect("write");
    let g = module_graph(src);
    assert_eq!(
        g["a"],
        BTreeSet::from(["b".to_string()]),
        "a comment is no reference"
    );
    assert_eq!(
        cycle(&g),
        Some(
            vec!["a", "b", "c", "a"]
                .into_iter()
                .map(String::from)
                .collect()
        )
    );
    std::fs::write(src.join("c.rs"), "fn f() {}").expect("write");
    assert_eq!(cycle(&module_graph(src)), None);
    // Inside a module: siblings under b/ that use each other, one by `super::`, one by
    // its absolute path; what they take from their parent is no edge.
    std::fs::write(
        src.join("b/mod.rs"),
        "mod x; mod y; pub(crate) fn shared() {}",
    )
    .expect("write");
    std::fs::write(src.join("b/x.rs"), "use super::y::Y; use super::shared;").expect("write");
    std::fs::write(
        src.join("b/y.rs"),
        "fn f() { crate::b::x::g(); super::shared() }",
    )
    .expect("write");
    let nested = module_graphs(src);
    let (_, g) = nested.iter().find(|(p, _)| p == "b").expect("b's graph");
    assert_eq!(
        cycle(g),
        Some(vec!["x", "y", "x"].into_iter().map(String::from).collect())
    );
    std::fs::write(src.join("b/y.rs"), "fn f() { super::shared() }").expect("write");
    let nested = module_graphs(src);
    assert!(nested.iter().all(|(_, g)| cycle(g).is_none()), "{nested:?}");
}

/// The top level of the repository (issue #33, point 4; `../shared/DESIGN.md`, "Layout"):
/// the design card's folders, and beside them only what a reader needs.
const TOP_LEVEL: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "README.md",
    "api",
    "appliance",
    "firmware-sim",
    "helm",
    "docs",
    // Beside them: benchmarks (with the traces they replay), scripts, examples, and the
    // files tools look for at the root.
    "bench",
    "scripts",
    "examples",
    "Dockerfile",
    "clippy.toml",
];

/// What `api/` and `appliance/` hold: the contract, and the node's crates.
const API: &[&str] = &["openapi.json", "PROTOCOL.md", "wire", "client", "python"];
const APPLIANCE: &[&str] = &[
    "format", "engine", "pod", "node", "tools", "plan", "cli", "testkit", "sim",
];

/// The entries `git ls-files` names directly under `dir` (a path relative to the root),
/// hidden ones left out.
fn tracked_entries(root: &Path, dir: &str) -> BTreeSet<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "--", dir])
        .output()
        .expect("run git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    let prefix = if dir == "." {
        String::new()
    } else {
        format!("{dir}/")
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|l| l.split('/').next())
        .filter(|e| !e.starts_with('.'))
        .map(String::from)
        .collect()
}

/// The differences between what `dir` holds and what it should: (missing, unexpected).
fn layout_gaps(have: &BTreeSet<String>, want: &[&str]) -> (Vec<String>, Vec<String>) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    (
        want.difference(have).cloned().collect(),
        have.difference(&want).cloned().collect(),
    )
}

#[test]
fn the_top_level_is_the_design_cards() {
    let root = workspace_root();
    for (dir, want) in [(".", TOP_LEVEL), ("api", API), ("appliance", APPLIANCE)] {
        let (missing, extra) = layout_gaps(&tracked_entries(&root, dir), want);
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{dir}: missing {missing:?}, not in the layout {extra:?}"
        );
    }
    // Every crate lives in api/, appliance/ or firmware-sim/, and dependencies point one
    // way: api ← appliance → firmware-sim (the contract and the simulator need nothing of
    // the node, nor of each other).
    let meta = metadata_of(false);
    let place_of = |manifest: &str| -> String {
        let rel = Path::new(manifest)
            .strip_prefix(&root)
            .expect("a member of the workspace");
        rel.components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .unwrap_or_default()
    };
    let mut place = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        let manifest = p["manifest_path"].as_str().unwrap_or("");
        if manifest.starts_with(root.to_str().expect("a UTF-8 root")) {
            place.insert(
                p["name"].as_str().unwrap_or("").to_string(),
                place_of(manifest),
            );
        }
    }
    let mut wrong = Vec::new();
    for p in meta["packages"].as_array().expect("packages") {
        let name = p["name"].as_str().unwrap_or("");
        let Some(mine) = place.get(name) else {
            continue;
        };
        if !["api", "appliance", "firmware-sim"].contains(&mine.as_str()) {
            wrong.push(format!("{name} lives in {mine}/"));
        }
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or("");
            let Some(theirs) = place.get(dep) else {
                continue;
            };
            let allowed = mine == theirs || (mine == "appliance" && theirs != "appliance");
            if !allowed {
                wrong.push(format!("{name} ({mine}/) depends on {dep} ({theirs}/)"));
            }
        }
    }
    assert!(place.len() >= LAYERS.len(), "found {} crates", place.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_layout_check_sees_what_is_missing_and_what_is_extra() {
    let have: BTreeSet<String> = ["api", "node", "docs"].map(String::from).into();
    let (missing, extra) = layout_gaps(&have, &["api", "appliance", "docs"]);
    assert_eq!(
        (missing, extra),
        (vec!["appliance".into()], vec!["node".into()])
    );
}
