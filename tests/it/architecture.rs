//! The layering, checked from the source: no import circle among the top-level modules
//! of `src/`, no command importing another, the library layer (`ops`) and the MCP
//! server free of clap and of the commands, stdout written only by the render layer, each
//! type name defined once in `src/` (read with `syn`), and each test helper defined once
//! under `tests/` (shared ones in `tests/it/support`), and no import circle among the files
//! of any folder (a folder's `mod.rs` sits on top of its files, never between them).
//! Read from the `crate::…`/`super::…` paths of every `.rs` file (comments skipped), so
//! `cargo test --test it -- architecture` is the command anyone can run to check it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crate's `src/`.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The file's text without its comments (`//` to the end of the line; doc comments
/// name modules in prose, which is no dependency).
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|line| match line.find("//") {
            // A `//` inside a string ("http://...") is rare in this crate and only ever
            // hides a dependency after it on the same line, never invents one.
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file under `root` belongs to (`ledger` for
/// `src/ledger/sqlite.rs`); None for the crate roots `lib.rs` and `main.rs`.
fn top_module(root: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// The names `code` reaches as `crate::NAME`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        // `$crate::` in a macro is the crate too; a longer identifier ending in `crate`
        // is not.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::{c, d}}`: the first name of each item at the group's top level.
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        let name: String = group[i..]
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        names.insert(name);
                        item_start = false;
                    }
                    _ => {}
                }
            }
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.insert(name);
        }
    }
    names
}

#[test]
fn the_path_reader_reads_grouped_imports() {
    let code = "use crate::{ops::{self, run}, vocab};\nuse crate::shim::Frame;\nfn f() { $crate::lab::x(); notcrate::y(); }";
    let names: Vec<String> = crate_paths(code).into_iter().collect();
    assert_eq!(names, ["lab", "ops", "shim", "vocab"]);
}

#[test]
fn the_keeper_knows_nothing_of_the_shim_or_the_host_layer() {
    // The keeper holds connections by key and relays bytes; what runs on a resident
    // channel is the host layer's, handed to it as an `ssh::keeper::ResidentShell`. The
    // callers' side is `ssh/keeper/`, the process `ssh/keeper_server.rs`.
    let mut files = rust_files(&src().join("ssh/keeper"));
    files.push(src().join("ssh/keeper_server.rs"));
    assert!(files.len() >= 4, "the keeper's files: {files:?}");
    let reached: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let rel = file.strip_prefix(src()).unwrap().display().to_string();
            crate_paths(&code_of(file))
                .into_iter()
                .filter(|name| name == "shim" || name == "host")
                .map(move |name| format!("{rel}: crate::{name}"))
        })
        .collect();
    assert!(
        reached.is_empty(),
        "the keeper reaches the shim or the host layer:\n{}",
        reached.join("\n")
    );
}

#[test]
fn no_database_crate_is_named_outside_the_store_folders() {
    // The ledger's core (events, chain, projection, checks, archive cut) and everything
    // above it are backend-free; the SQL and the database crates live in
    // `ledger/store/sqlite/` and `ledger/store/postgres/` only. One exception: the
    // ledger's unit tests, which edit a SQLite file behind the `Ledger`'s back (they
    // drive the `Ledger`, so they cannot live under the store it uses).
    let store = src().join("ledger").join("store");
    let unit_tests = src().join("ledger").join("tests.rs");
    let outside: Vec<PathBuf> = rust_files(&src())
        .into_iter()
        .filter(|file| !file.starts_with(&store) && *file != unit_tests)
        .collect();
    assert!(
        outside.iter().any(|f| f.ends_with("ledger/mod.rs")),
        "the ledger's façade is among the files checked"
    );
    let found = occurrences(&outside, &["rusqlite", "tokio_postgres"]);
    assert!(
        found.is_empty(),
        "a database crate named outside src/ledger/store/:\n{}",
        found.join("\n")
    );
}

/// Which top-level module uses which, for the tree at `root`.
fn module_graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<String> = rust_files(root)
        .iter()
        .filter_map(|f| top_module(root, f))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in rust_files(root) {
        let Some(from) = top_module(root, &file) else {
            continue;
        };
        let uses: Vec<String> = crate_paths(&code_of(&file))
            .into_iter()
            // Macros exported at the crate root (`crate::out!`) are not modules.
            .filter(|to| *to != from && modules.contains(to))
            .collect();
        graph.entry(from).or_default().extend(uses);
    }
    graph
}

/// One circle in `graph`, as the path that closes it (`a -> b -> a`), if there is one.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// True when `needle` occurs in `code` not as the tail of a longer name (`println!(` is
/// not found in `eprintln!(`).
fn contains_word(code: &str, needle: &str) -> bool {
    code.match_indices(needle).any(|(at, _)| {
        !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Where in `files` one of `needles` occurs, as `file: needle` lines.
fn occurrences(files: &[PathBuf], needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let code = code_of(file);
        for needle in needles {
            if contains_word(&code, needle) {
                found.push(format!("{}: {needle}", file.display()));
            }
        }
    }
    found
}

#[test]
fn top_level_modules_import_each_other_without_a_circle() {
    let graph = module_graph(&src());
    assert!(
        graph
            .get("commands")
            .is_some_and(|uses| uses.contains("cli")),
        "the graph was not read (no `commands -> cli`): {graph:?}"
    );
    if let Some(circle) = find_circle(&graph) {
        panic!(
            "import circle among top-level modules: {}; move what both need into a module of its own, or convert at the edge",
            circle.join(" -> ")
        );
    }
}

#[test]
fn a_circle_between_two_modules_is_found_and_named() {
    // The checker itself on a tree made for it: a -> b -> c -> a, and d on its own.
    let root = std::env::temp_dir().join(format!("opmark-arch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("b")).unwrap();
    std::fs::write(root.join("lib.rs"), "pub mod a; pub mod b; pub mod c;").unwrap();
    std::fs::write(
        root.join("a.rs"),
        "use crate::b::Thing;\n// crate::d in a comment\n",
    )
    .unwrap();
    std::fs::write(root.join("b/mod.rs"), "fn f() { crate::c::g() }").unwrap();
    std::fs::write(root.join("c.rs"), "pub fn g() { $crate::a::h() }").unwrap();
    std::fs::write(root.join("d.rs"), "").unwrap();
    let graph = module_graph(&root);
    let circle = find_circle(&graph);
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(
        circle,
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]),
        "{graph:?}"
    );
    assert!(
        !graph["a"].contains("d"),
        "a comment is no import: {graph:?}"
    );
}

#[test]
fn no_command_imports_another_command() {
    let dir = src().join("commands");
    // What commands share is not a command: the args-to-context glue and the render
    // layer (and `host_changed`, how an operator command renders a host change, where
    // that work lands; `stdin`, what the CLI reads of this process's stdin).
    let shared = ["mod", "common", "render", "host_changed", "stdin"];
    let commands: Vec<String> = rust_files(&dir)
        .iter()
        .filter_map(|f| f.file_stem()?.to_str().map(str::to_owned))
        .filter(|name| !shared.contains(&name.as_str()))
        .collect();
    assert!(commands.iter().any(|c| c == "run"), "{commands:?}");
    let files: Vec<PathBuf> = rust_files(&dir)
        .into_iter()
        .filter(|f| f.file_stem().is_some_and(|s| s != "mod"))
        .collect();
    let needles: Vec<String> = commands
        .iter()
        .flat_map(|c| [format!("super::{c}::"), format!("crate::commands::{c}::")])
        .collect();
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    let found = occurrences(&files, &needles);
    assert!(
        found.is_empty(),
        "a command uses another (move the shared part into ops/ or commands/common.rs):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_library_layer_and_mcp_know_nothing_of_clap_the_cli_or_the_commands() {
    let mut files = rust_files(&src().join("ops"));
    files.extend(rust_files(&src().join("mcp")));
    assert!(files.len() > 5, "{files:?}");
    let found = occurrences(
        &files,
        &[
            "clap",
            "crate::cli",
            "crate::commands",
            "capture_json",
            "print!(",
            "println!(",
            "crate::out!",
            "crate::outln!",
            // Words for a person on stderr are the CLI's too (a run's watcher says them).
            "logging::say",
            "say!(",
        ],
    );
    assert!(
        found.is_empty(),
        "ops/ and mcp/ take typed requests and return reports; rendering is the CLI's:\n{}",
        found.join("\n")
    );
}

#[test]
fn only_the_render_layer_writes_to_stdout() {
    let root = src();
    let allowed = [
        // The one output object.
        root.join("commands/render.rs"),
        // The raw write under it (and the live output of a running command, which is
        // the remote command's own stdout, not opmark's answer).
        root.join("logging.rs"),
        // The MCP server's JSON-RPC wire: stdout is the protocol, and a write that fails
        // ends the session (the client is gone), never a panic.
        root.join("mcp/wire.rs"),
    ];
    let files: Vec<PathBuf> = rust_files(&root)
        .into_iter()
        .filter(|f| !allowed.contains(f))
        .collect();
    let found = occurrences(&files, &["print!(", "println!(", "io::stdout()"]);
    assert!(
        found.is_empty(),
        "write through commands::render::Out (out!/outln!), which turns a closed stdout into an error instead of a panic:\n{}",
        found.join("\n")
    );
}

/// The functions a test file defines at its top level, test functions aside: its helpers.
fn helpers_in(code: &str) -> Vec<String> {
    let lines: Vec<&str> = code.lines().collect();
    let mut names = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = ["pub(crate) ", "pub ", ""]
            .iter()
            .find_map(|vis| line.strip_prefix(vis))
            .map(|rest| rest.strip_prefix("async ").unwrap_or(rest))
            .and_then(|rest| rest.strip_prefix("fn "))
        else {
            continue;
        };
        let attributes = lines[..i]
            .iter()
            .rev()
            .take_while(|l| l.starts_with("#[") || l.starts_with("//"));
        if attributes
            .clone()
            .any(|l| l.starts_with("#[test") || l.starts_with("#[tokio::test"))
        {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        names.push(name);
    }
    names
}

#[test]
fn the_helper_reader_skips_tests_and_nested_functions() {
    let code = "#[test]\nfn a_test() {\n    fn nested() {}\n}\n\n/// Doc.\npub fn lines() {}\n\n#[tokio::test]\n// why\nasync fn other() {}\nasync fn wait() {}\n";
    assert_eq!(helpers_in(code), ["lines", "wait"]);
}

/// The names `read` finds in more than one place among the `.rs` files under `dir`
/// (`name: file, file`), after checking that it found `expected` at all.
fn defined_twice(dir: &Path, read: fn(&str) -> Vec<String>, expected: &str) -> Vec<String> {
    let mut defined: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in rust_files(dir) {
        let code = std::fs::read_to_string(&file).unwrap();
        let rel = file.strip_prefix(dir).unwrap().display().to_string();
        for name in read(&code) {
            defined.entry(name).or_default().push(rel.clone());
        }
    }
    assert!(
        defined.contains_key(expected),
        "{expected} not read: {defined:?}"
    );
    defined
        .iter()
        .filter(|(_, files)| files.len() > 1)
        .map(|(name, files)| format!("{name}: {}", files.join(", ")))
        .collect()
}

#[test]
fn no_test_helper_is_defined_twice_in_tests() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let twice = defined_twice(&tests, helpers_in, "fresh_dir");
    assert!(
        twice.is_empty(),
        "test helpers defined more than once (keep one in tests/it/support, or name each for what it does):\n{}",
        twice.join("\n")
    );
}

/// The types a file defines (`struct`, `enum`, `union`, `trait`, `type` aliases), at its
/// top level and in its inline modules, tests' included; not the associated types of an
/// impl or trait, which fill a slot the trait names (`type Err`), and not items local to a
/// function body.
fn types_in(code: &str) -> Vec<String> {
    fn walk(items: &[syn::Item], out: &mut Vec<String>) {
        for item in items {
            match item {
                syn::Item::Struct(s) => out.push(s.ident.to_string()),
                syn::Item::Enum(e) => out.push(e.ident.to_string()),
                syn::Item::Union(u) => out.push(u.ident.to_string()),
                syn::Item::Trait(t) => out.push(t.ident.to_string()),
                syn::Item::Type(t) => out.push(t.ident.to_string()),
                syn::Item::Mod(m) => {
                    if let Some((_, inner)) = &m.content {
                        walk(inner, out);
                    }
                }
                _ => {}
            }
        }
    }
    let file = syn::parse_file(code).unwrap_or_else(|e| panic!("not Rust: {e}"));
    let mut out = Vec::new();
    walk(&file.items, &mut out);
    out
}

#[test]
fn the_type_reader_skips_associated_types_and_reads_inline_modules() {
    let code = "pub struct Error;\nimpl std::str::FromStr for Error {\n    type Err = String;\n    fn from_str(_: &str) -> Result<Self, String> { struct Local; Ok(Error) }\n}\ntrait Sink { type Item; }\npub(crate) type Counts = u8;\n#[cfg(test)]\nmod tests {\n    enum Fixture { A }\n}\n";
    assert_eq!(types_in(code), ["Error", "Sink", "Counts", "Fixture"]);
}

#[test]
fn no_type_name_is_defined_twice_in_src() {
    // Two types of one name make every reader ask which one a signature means, and a
    // `use` of the wrong one compiles whenever their fields happen to agree.
    let twice = defined_twice(&src(), types_in, "Verdict");
    assert!(
        twice.is_empty(),
        "type names defined more than once in src/ (name each for what it is):\n{}",
        twice.join("\n")
    );
}

/// The module path of `file` under `root` (`["ssh", "keeper", "client"]` for
/// `src/ssh/keeper/client.rs`, `["ssh", "keeper"]` for its `mod.rs`).
fn module_path(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut path: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    path
}

/// `code` without its test modules (`#[cfg(test)] mod … { … }`, `cfg(all(test, …))` too,
/// other attributes between): a test module's `super` is the file it sits in, and what
/// tests import is no part of the layering.
fn without_test_modules(code: &str) -> String {
    /// The end of the attribute starting at `text` (`#[…]`, brackets nested).
    fn attribute_end(text: &str) -> usize {
        let mut depth = 0;
        for (i, c) in text.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                _ => {}
            }
        }
        text.len()
    }
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = ["#[cfg(test)]", "#[cfg(all(test"]
        .iter()
        .filter_map(|a| rest.find(a))
        .min()
    {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let mut body = &after[attribute_end(after)..];
        loop {
            body = body.trim_start();
            if !body.starts_with("#[") {
                break;
            }
            body = &body[attribute_end(body)..];
        }
        let (Some(open), true) = (body.find('{'), body.starts_with("mod ")) else {
            out.push_str(&after[..2]);
            rest = &after[2..];
            continue;
        };
        if body[..open].contains(';') {
            out.push_str(&after[..2]);
            rest = &after[2..];
            continue;
        }
        let mut depth = 0;
        let mut end = body.len();
        for (i, c) in body[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &body[end..];
    }
    out.push_str(rest);
    out
}

/// The paths of one use tree or expression path starting at `text` (`a::{b, c::D}` gives
/// `a::b` and `a::c::D`), each as its segments; `self` in a group is the group's prefix and
/// `*` adds nothing to it.
fn path_tree(text: &str) -> Vec<Vec<String>> {
    struct Reader<'a> {
        s: &'a [u8],
        at: usize,
        out: Vec<Vec<String>>,
    }
    impl Reader<'_> {
        fn peek(&self) -> Option<u8> {
            self.s.get(self.at).copied()
        }
        fn name(&mut self) -> Option<String> {
            let start = self.at;
            while self
                .peek()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'*')
            {
                self.at += 1;
            }
            (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into())
        }
        fn tree(&mut self, mut path: Vec<String>) {
            loop {
                if self.peek() == Some(b'{') {
                    self.at += 1;
                    loop {
                        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
                            self.at += 1;
                        }
                        if self.peek() == Some(b'}') {
                            self.at += 1;
                            return;
                        }
                        self.tree(path.clone());
                        // The rest of the item (` as Name`) up to its end.
                        while self.peek().is_some_and(|c| c != b',' && c != b'}') {
                            self.at += 1;
                        }
                        match self.peek() {
                            Some(b',') => self.at += 1,
                            Some(_) => {
                                self.at += 1;
                                return;
                            }
                            None => return,
                        }
                    }
                }
                let Some(name) = self.name() else {
                    self.out.push(path);
                    return;
                };
                if name != "self" && name != "*" {
                    path.push(name);
                }
                if self.s[self.at..].starts_with(b"::") {
                    self.at += 2;
                } else {
                    self.out.push(path);
                    return;
                }
            }
        }
    }
    let mut reader = Reader {
        s: text.as_bytes(),
        at: 0,
        out: Vec::new(),
    };
    reader.tree(Vec::new());
    reader.out
}

/// The absolute module paths `code` names, as the file at module path `at` reads them:
/// `crate::…`, `self::…`, `super::…` and a bare path into one of `children` (the modules
/// declared below this one), grouped imports expanded.
fn named_paths(code: &str, at: &[String], children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let code = without_test_modules(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let word_len = code[i..]
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
            .count();
        if word_len == 0 {
            i += code[i..].chars().next().map_or(1, char::len_utf8);
            continue;
        }
        let word = &code[i..i + word_len];
        let starts_a_path = !code[..i].ends_with("::")
            && !code[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
            && code[i + word_len..].starts_with("::");
        let base = match word {
            _ if !starts_a_path => None,
            "crate" => Some((Vec::new(), i + word_len + 2)),
            "self" => Some((at.to_vec(), i + word_len + 2)),
            "super" => Some((at[..at.len().saturating_sub(1)].to_vec(), i + word_len + 2)),
            w if children.contains(w) => Some((at.to_vec(), i)),
            _ => None,
        };
        if let Some((base, from)) = base {
            for tail in path_tree(&code[from..]) {
                let mut path = base.clone();
                for segment in tail {
                    match segment.as_str() {
                        "super" => {
                            path.pop();
                        }
                        _ => path.push(segment),
                    }
                }
                out.push(path);
            }
        }
        i += word_len;
    }
    out
}

/// Per folder under `root` (`ssh`, `ssh/keeper`, …), the graph of its files: a node per
/// file (`mod` for its `mod.rs`) and per subfolder, an arrow where one names the other by
/// path. A child naming an item of `mod.rs` (re-exports included) points at `mod`.
fn folder_graphs(root: &Path) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let files = rust_files(root);
    let paths: Vec<(PathBuf, Vec<String>)> = files
        .iter()
        .map(|f| (f.clone(), module_path(root, f)))
        .collect();
    let children_of = |at: &[String]| -> BTreeSet<String> {
        paths
            .iter()
            .filter(|(_, p)| p.len() == at.len() + 1 && p.starts_with(at))
            .map(|(_, p)| p[at.len()].clone())
            .collect()
    };
    let folders: BTreeSet<Vec<String>> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "mod.rs"))
        .map(|f| module_path(root, f))
        .collect();
    let mut graphs = BTreeMap::new();
    for folder in folders {
        let children = children_of(&folder);
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (file, at) in paths.iter().filter(|(_, p)| p.starts_with(&folder)) {
            let from = at
                .get(folder.len())
                .cloned()
                .unwrap_or_else(|| "mod".into());
            let named = named_paths(&code_of(file), at, &children_of(at));
            for path in named.iter().filter(|p| p.starts_with(&folder)) {
                let to = match path.get(folder.len()) {
                    Some(child) if children.contains(child) => child.clone(),
                    _ => "mod".into(),
                };
                if to != from {
                    graph.entry(from.clone()).or_default().insert(to);
                }
            }
        }
        graphs.insert(folder.join("/"), graph);
    }
    graphs
}

/// One circle in each folder that has one, as `folder: a -> b -> a`.
fn folder_circles(root: &Path) -> Vec<String> {
    folder_graphs(root)
        .iter()
        .filter_map(|(folder, graph)| {
            find_circle(graph).map(|c| format!("src/{folder}/: {}", c.join(" -> ")))
        })
        .collect()
}

#[test]
fn the_folder_reader_follows_super_grouped_imports_and_re_exports_but_not_tests() {
    let root = crate::support::fresh_dir("opmark-arch-folders");
    std::fs::create_dir_all(root.join("f/sub")).unwrap();
    let write = |name: &str, code: &str| std::fs::write(root.join(name), code).unwrap();
    write("lib.rs", "pub mod f;");
    write("f/mod.rs", "mod a;\nmod b;\nmod sub;\npub use a::Thing;\n");
    write(
        "f/a.rs",
        "use super::{b::{self, Other}, sub::Deep as D};\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::f::Thing;\n}\n#[cfg(all(test, unix))]\n#[allow(dead_code)]\nmod unix_tests {\n    use super::*;\n}\n",
    );
    write("f/b.rs", "pub fn g() -> super::Thing { todo() }\n");
    write("f/sub/mod.rs", "pub fn h() { crate::f::b::g(); }\n");
    let graphs = folder_graphs(&root);
    let circles = folder_circles(&root);
    std::fs::remove_dir_all(&root).unwrap();
    let f = &graphs["f"];
    assert_eq!(f["a"], BTreeSet::from(["b".into(), "sub".into()]), "{f:?}");
    assert_eq!(f["mod"], BTreeSet::from(["a".into()]), "{f:?}");
    assert_eq!(f["b"], BTreeSet::from(["mod".into()]), "{f:?}");
    assert_eq!(f["sub"], BTreeSet::from(["b".into()]), "{f:?}");
    assert_eq!(circles, ["src/f/: a -> b -> mod -> a"]);
}

#[test]
fn no_circle_inside_any_folder() {
    // A circle inside a folder is a module that cannot be read, tested or moved without
    // the others: what the files of a folder share lives in a leaf module they both name
    // (`super::error::LedgerError`), and `mod.rs` sits on top and re-exports.
    let graphs = folder_graphs(&src());
    assert!(
        graphs["ssh"].get("keeper").is_some_and(|to| !to.is_empty()),
        "the graphs were not read (nothing from ssh/keeper): {graphs:?}"
    );
    let circles = folder_circles(&src());
    assert!(
        circles.is_empty(),
        "import circles inside folders of src/ (move what the files share into a module of its own that names none of them):\n{}",
        circles.join("\n")
    );
}
