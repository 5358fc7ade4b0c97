//! The design lives in `docs/`, and the code cites it there: no comment cites a document
//! that is not in the repository (the product specification, the findings notes), and
//! every `docs/<page>.md#<anchor>` that code, scripts, the README or the docs themselves
//! cite names a page and a heading that exist, and every file the docs and the README link
//! to is there. `scripts/cite-docs.sh` rewrites the old citations; renaming a heading or
//! moving a file means updating what cites it too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

use crate::support::repo;

/// This file names the forbidden words in its own checks.
const SELF: &str = "tests/it/architecture_docs.rs";

/// Every text file under `dirs` (relative to the repository), as (relative path, text).
fn texts(dirs: &[&str]) -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    for d in dirs {
        let p = repo().join(d);
        if p.is_file() {
            files.push(p);
        } else {
            walk(&p, &mut files);
        }
    }
    files.sort();
    files
        .into_iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).ok()?;
            let rel = p.strip_prefix(repo()).ok()?.to_string_lossy().into_owned();
            (rel != SELF).then_some((rel, text))
        })
        .collect()
}

/// The code, the shim, the tests, the benchmarks and the scripts.
const SOURCES: &[&str] = &[
    "src",
    "remote-scripts",
    "tests",
    "benches",
    "examples",
    "scripts",
];

/// GitHub's anchor for a heading: lower case, spaces to `-`, everything but letters,
/// digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Each page of `docs/` and the anchors of its headings.
fn pages() -> BTreeMap<String, BTreeSet<String>> {
    let heading = Regex::new(r"(?m)^#{1,6} (.+)$").unwrap();
    texts(&["docs"])
        .into_iter()
        .filter(|(path, _)| path.ends_with(".md"))
        .map(|(path, text)| {
            let name = path.trim_start_matches("docs/").to_owned();
            let anchors = heading
                .captures_iter(&text)
                .map(|c| anchor(&c[1]))
                .collect();
            (name, anchors)
        })
        .collect()
}

/// Where a citation was found, and what it cites.
#[derive(Debug)]
struct Cite {
    at: String,
    page: String,
    anchor: Option<String>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset].matches('\n').count() + 1
}

/// Every `docs/<page>.md[#anchor]` in the sources and the README, and every relative link
/// `](<page>.md#anchor)` or `](#anchor)` inside `docs/`.
fn citations() -> Vec<Cite> {
    let cited = Regex::new(r"docs/([a-z0-9_-]+\.md)(?:#([a-z0-9_-]+))?").unwrap();
    let link = Regex::new(r"\]\(([a-z0-9_-]+\.md)?(?:#([a-z0-9_-]+))?\)").unwrap();
    let mut out = Vec::new();
    let mut sources = texts(SOURCES);
    sources.extend(texts(&["README.md"]));
    for (path, text) in &sources {
        for c in cited.captures_iter(text) {
            out.push(Cite {
                at: format!("{path}:{}", line_of(text, c.get(0).unwrap().start())),
                page: c[1].to_owned(),
                anchor: c.get(2).map(|m| m.as_str().to_owned()),
            });
        }
    }
    for (path, text) in texts(&["docs"]) {
        let own = path.trim_start_matches("docs/").to_owned();
        for c in link.captures_iter(&text) {
            if c.get(1).is_none() && c.get(2).is_none() {
                continue;
            }
            out.push(Cite {
                at: format!("{path}:{}", line_of(&text, c.get(0).unwrap().start())),
                page: c.get(1).map_or(own.clone(), |m| m.as_str().to_owned()),
                anchor: c.get(2).map(|m| m.as_str().to_owned()),
            });
        }
    }
    out
}

#[test]
fn every_docs_anchor_that_is_cited_exists() {
    let pages = pages();
    assert!(
        pages.contains_key("README.md") && pages.len() >= 7,
        "docs/ lacks its pages: {:?}",
        pages.keys()
    );
    let cites = citations();
    assert!(
        cites.len() > 100,
        "the docs cite each other and the README cites them: found only {}",
        cites.len()
    );
    let broken: Vec<String> = cites
        .iter()
        .filter(|c| match (pages.get(&c.page), &c.anchor) {
            (None, _) => true,
            (Some(anchors), Some(a)) => !anchors.contains(a),
            (Some(_), None) => false,
        })
        .map(|c| {
            format!(
                "{}: docs/{}{}",
                c.at,
                c.page,
                c.anchor
                    .as_ref()
                    .map(|a| format!("#{a}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    assert!(
        broken.is_empty(),
        "citations of docs/ pages or headings that do not exist (rename the citation with the \
         heading, or add the heading):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_docs_index_lists_every_page_and_every_anchor() {
    let pages = pages();
    let index = std::fs::read_to_string(repo().join("docs/README.md")).unwrap();
    let heading = Regex::new(r"(?m)^## (.+)$").unwrap();
    let mut missing = Vec::new();
    for (page, _) in pages.iter().filter(|(p, _)| p.as_str() != "README.md") {
        let text = std::fs::read_to_string(repo().join("docs").join(page)).unwrap();
        if !index.contains(&format!("]({page})")) {
            missing.push(page.clone());
        }
        for h in heading.captures_iter(&text) {
            let target = format!("]({page}#{})", anchor(&h[1]));
            if !index.contains(&target) {
                missing.push(format!("{page}#{}", anchor(&h[1])));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/README.md does not list these pages or anchors:\n{}",
        missing.join("\n")
    );
}

/// One markdown link of docs/ or the README: where it stands, the directory it resolves
/// against, and the groups `link` captured.
struct Link {
    at: String,
    dir: PathBuf,
    groups: Vec<String>,
}

/// Every match of `link` in docs/ and the README.
fn markdown_links(link: &Regex) -> Vec<Link> {
    let mut pages = texts(&["docs"]);
    pages.extend(texts(&["README.md"]));
    let mut found = Vec::new();
    for (path, text) in &pages {
        let dir = repo().join(path).parent().unwrap().to_owned();
        for c in link.captures_iter(text) {
            found.push(Link {
                at: format!("{path}:{}", line_of(text, c.get(0).unwrap().start())),
                dir: dir.clone(),
                groups: c
                    .iter()
                    .skip(1)
                    .map(|g| g.map_or(String::new(), |g| g.as_str().to_owned()))
                    .collect(),
            });
        }
    }
    found
}

#[test]
fn every_file_the_docs_and_the_readme_link_to_exists() {
    let link = Regex::new(r"\]\(([^)#\s]+)(?:#[^)]*)?\)").unwrap();
    let mut missing = Vec::new();
    let mut seen = 0;
    for l in markdown_links(&link) {
        let target = &l.groups[0];
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        seen += 1;
        if !l.dir.join(target).exists() {
            missing.push(format!("{}: {target}", l.at));
        }
    }
    assert!(seen > 50, "only {seen} file links found");
    assert!(
        missing.is_empty(),
        "links to files that do not exist (moved or renamed? link the new place):\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_row_test_of_the_decision_table_is_named_by_its_rule_in_the_docs() {
    let code = std::fs::read_to_string(repo().join("src/operation/decide.rs")).unwrap();
    let doc = std::fs::read_to_string(repo().join("docs/decisions.md")).unwrap();
    let test = Regex::new(r"#\[test\]\s*fn ([a-z0-9_]+)\s*\(").unwrap();
    let tests: BTreeSet<&str> = test
        .captures_iter(&code)
        .map(|c| c.get(1).unwrap().as_str())
        .collect();
    assert!(tests.len() > 40, "decide.rs has only {} tests", tests.len());
    let undocumented: Vec<&&str> = tests
        .iter()
        .filter(|t| !doc.contains(&format!("`{t}`")))
        .collect();
    // A rule's test names read like `..._then_...`; every one the docs name must exist.
    let named = Regex::new(r"`([a-z0-9]+(?:_[a-z0-9]+){4,})`").unwrap();
    let gone: Vec<&str> = named
        .captures_iter(&doc)
        .map(|c| c.get(1).unwrap().as_str())
        .filter(|n| n.contains("_then_") && !tests.contains(n))
        .collect();
    assert!(
        undocumented.is_empty() && gone.is_empty(),
        "docs/decisions.md and the tests of src/operation/decide.rs disagree: tests no rule \
         names: {undocumented:?}; names of tests that do not exist: {gone:?}"
    );
}

/// Words that cite the absent documents: `SPEC` as a word, and `FINDINGS` other than the
/// exit code of that name (`exit_code::FINDINGS`, `const FINDINGS`).
fn absent_citations(text: &str) -> Vec<usize> {
    let spec = Regex::new(r"\bSPEC\b").unwrap();
    let findings = Regex::new(r"\bFINDINGS\b").unwrap();
    let mut lines = BTreeSet::new();
    for m in spec.find_iter(text) {
        lines.insert(line_of(text, m.start()));
    }
    for m in findings.find_iter(text) {
        let before = &text[..m.start()];
        let after = &text[m.end()..];
        if before.ends_with("::") || before.ends_with("const ") || after.starts_with(':') {
            continue;
        }
        lines.insert(line_of(text, m.start()));
    }
    lines.into_iter().collect()
}

#[test]
fn the_check_for_absent_citations_finds_each_form_and_spares_the_exit_code() {
    for cited in [
        "// (SPEC section 9)",
        "//! (SPEC 17)",
        "// SPEC §6",
        "/// the SPEC's pattern",
        "# (SPEC\n# section 3)",
        "// slow (FINDINGS).",
        "// ~630 ms; FINDINGS)",
    ] {
        assert_eq!(absent_citations(cited), [1], "{cited:?}");
    }
    for fine in [
        "exit_code::FINDINGS",
        "pub const FINDINGS: u8 = 1;",
        "SPECIAL SPECS",
        "docs/guarantees.md#verdicts",
    ] {
        assert!(absent_citations(fine).is_empty(), "{fine:?}");
    }
}

#[test]
fn no_source_file_cites_the_absent_spec_or_findings() {
    let mut found = Vec::new();
    let mut sources = texts(SOURCES);
    sources.extend(texts(&["README.md"]));
    for (path, text) in sources {
        if path == "scripts/cite-docs.sh" {
            continue;
        }
        for line in absent_citations(&text) {
            let shown = text.lines().nth(line - 1).unwrap_or_default().trim();
            found.push(format!("{path}:{line}: {shown}"));
        }
    }
    assert!(
        found.is_empty(),
        "citations of documents that are not in the repository; cite docs/ instead \
         (scripts/cite-docs.sh rewrites the known forms):\n{}",
        found.join("\n")
    );
}

/// The anchors GitHub makes for `text`'s headings: each heading's [`anchor`], a repeated
/// one with `-1`, `-2`... after it.
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let heading = Regex::new(r"(?m)^#{1,6} (.+)$").unwrap();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for c in heading.captures_iter(text) {
        let a = anchor(&c[1]);
        let n = seen.entry(a.clone()).or_insert(0);
        anchors.insert(if *n == 0 {
            a.clone()
        } else {
            format!("{a}-{n}")
        });
        *n += 1;
    }
    anchors
}

#[test]
fn every_anchor_the_docs_and_the_readme_link_to_exists() {
    let link = Regex::new(r"\]\(([^)#\s]*)#([^)\s]+)\)").unwrap();
    let mut missing = Vec::new();
    let mut seen = 0;
    for l in markdown_links(&link) {
        let (file, want) = (&l.groups[0], &l.groups[1]);
        let target = if file.is_empty() {
            // `(#anchor)`: the page itself.
            repo().join(l.at.split(':').next().unwrap())
        } else {
            l.dir.join(file)
        };
        // Links into source files name lines or symbols, not headings.
        if !target.to_string_lossy().ends_with(".md") {
            continue;
        }
        seen += 1;
        let Ok(linked) = std::fs::read_to_string(&target) else {
            continue; // every_file_the_docs_and_the_readme_link_to_exists says so
        };
        if !heading_anchors(&linked).contains(want) {
            missing.push(format!("{}: {file}#{want}", l.at));
        }
    }
    assert!(seen > 50, "only {seen} anchor links found");
    assert!(
        missing.is_empty(),
        "links to headings that do not exist (renamed or moved? link the new anchor):\n{}",
        missing.join("\n")
    );
}
