//! Every promise of docs/guarantees.md is tied to the code that keeps it and the tests that
//! fail without it (docs/claims.md). These tests keep that map whole: no promise without a
//! row, no row without its promise, no cited symbol or test that does not exist.

use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};

use crate::support::repo;

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// One row of the claims table: its id, its guards and its tests, as `path::symbol`.
struct Row {
    id: String,
    guards: Vec<(String, String)>,
    tests: Vec<(String, String)>,
}

fn cited(cell: &str) -> Vec<(String, String)> {
    let item = Regex::new(r"`([A-Za-z0-9_./-]+)::([A-Za-z_][A-Za-z0-9_]*)`").unwrap();
    item.captures_iter(cell)
        .map(|c| (c[1].to_owned(), c[2].to_owned()))
        .collect()
}

fn claims_table() -> Vec<Row> {
    let text = read("docs/claims.md");
    let mut rows = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // `| id | promise | guard | tests |` splits into six cells, the outer two empty.
        if cells.len() != 6 || cells[1] == "id" || cells[1].starts_with("---") {
            continue;
        }
        rows.push(Row {
            id: cells[1].to_owned(),
            guards: cited(cells[3]),
            tests: cited(cells[4]),
        });
    }
    rows
}

/// The ids guarantees.md cites, each with the line it is cited on.
fn ids_in_guarantees() -> BTreeMap<String, usize> {
    let tag = Regex::new(r"\[\[([a-z0-9-]+)\]\]").unwrap();
    let mut ids = BTreeMap::new();
    for (n, line) in read("docs/guarantees.md").lines().enumerate() {
        for c in tag.captures_iter(line) {
            ids.entry(c[1].to_owned()).or_insert(n + 1);
        }
    }
    ids
}

/// The blocks of guarantees.md that make promises: every paragraph and list item past the
/// vocabulary, and the rows of the verdict table, each as (first line number, text). A
/// paragraph that ends in `:` leads into the list under it, whose items carry the ids; a
/// table elsewhere defines words and makes no promise of its own.
fn promise_blocks() -> Vec<(usize, String)> {
    let text = read("docs/guarantees.md");
    let item_start = Regex::new(r"^(\s*)(- |\d+\. )").unwrap();
    let mut blocks: Vec<(usize, String)> = Vec::new();
    let mut section = String::new();
    let mut current: Option<(usize, String)> = None;
    let flush = |current: &mut Option<(usize, String)>, blocks: &mut Vec<(usize, String)>| {
        if let Some(b) = current.take() {
            blocks.push(b);
        }
    };
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        if let Some(h) = line.strip_prefix("## ") {
            flush(&mut current, &mut blocks);
            section = h.trim().to_owned();
            continue;
        }
        if section.is_empty() || section == "Vocabulary" || line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            flush(&mut current, &mut blocks);
            continue;
        }
        if line.starts_with('|') {
            flush(&mut current, &mut blocks);
            if section == "Verdicts" && line.starts_with("| `") {
                blocks.push((n, line.to_owned()));
            }
            continue;
        }
        if item_start.is_match(line) {
            flush(&mut current, &mut blocks);
        }
        match &mut current {
            Some((_, t)) => {
                t.push('\n');
                t.push_str(line);
            }
            None => current = Some((n, line.to_owned())),
        }
    }
    flush(&mut current, &mut blocks);
    blocks
        .into_iter()
        .filter(|(_, t)| !t.trim_end().ends_with(':'))
        .collect()
}

/// Whether `file` defines `symbol`: a Rust item, or a function of a shell script.
fn defines(file: &str, symbol: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(repo().join(file)) else {
        return false;
    };
    let s = regex::escape(symbol);
    let pattern = if file.ends_with(".sh") {
        format!(r"(?m)^{s}\(\)")
    } else {
        format!(r"\b(fn|struct|enum|const|static|type|trait|mod)\s+{s}\b")
    };
    Regex::new(&pattern).unwrap().is_match(&text)
}

/// Whether `file` has a test function `name`: `fn name(` with a `#[test]` (or an async
/// test attribute) among the attributes right above it.
fn has_test(file: &str, name: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(repo().join(file)) else {
        return false;
    };
    let lines: Vec<&str> = text.lines().collect();
    let signature = Regex::new(&format!(
        r"^\s*(pub\s+)?(async\s+)?fn\s+{}\s*\(",
        regex::escape(name)
    ))
    .unwrap();
    lines.iter().enumerate().any(|(i, line)| {
        signature.is_match(line)
            && lines[..i]
                .iter()
                .rev()
                .take_while(|l| {
                    let l = l.trim();
                    l.starts_with("#[") || l.starts_with("//") || l.is_empty()
                })
                .any(|l| l.trim().starts_with("#[test]") || l.trim().contains("::test"))
    })
}

#[test]
fn every_promise_of_the_guarantees_cites_an_id() {
    let tag = Regex::new(r"\[\[[a-z0-9-]+\]\]").unwrap();
    let blocks = promise_blocks();
    assert!(
        blocks.len() > 40,
        "guarantees.md should read as many promises; found only {} blocks",
        blocks.len()
    );
    let bare: Vec<String> = blocks
        .iter()
        .filter(|(_, t)| !tag.is_match(t))
        .map(|(n, t)| format!("docs/guarantees.md:{n}: {}", t.lines().next().unwrap_or("")))
        .collect();
    assert!(
        bare.is_empty(),
        "these promises cite no claim id (add `[[id]]` and its row in docs/claims.md):\n{}",
        bare.join("\n")
    );
}

#[test]
fn every_cited_id_has_one_row_and_every_row_is_cited() {
    let rows = claims_table();
    let cited = ids_in_guarantees();
    let mut seen = BTreeSet::new();
    let twice: Vec<&str> = rows
        .iter()
        .filter(|r| !seen.insert(r.id.as_str()))
        .map(|r| r.id.as_str())
        .collect();
    assert!(twice.is_empty(), "ids with more than one row: {twice:?}");
    let uncited: Vec<&str> = rows
        .iter()
        .filter(|r| !cited.contains_key(&r.id))
        .map(|r| r.id.as_str())
        .collect();
    assert!(
        uncited.is_empty(),
        "rows of docs/claims.md whose id guarantees.md never cites: {uncited:?}"
    );
    let missing: Vec<String> = cited
        .iter()
        .filter(|(id, _)| !seen.contains(id.as_str()))
        .map(|(id, line)| format!("{id} (docs/guarantees.md:{line})"))
        .collect();
    assert!(
        missing.is_empty(),
        "ids cited in guarantees.md without a row in docs/claims.md: {missing:?}"
    );
}

#[test]
fn every_row_names_a_guard_and_a_test_that_exist() {
    let rows = claims_table();
    assert!(
        rows.len() > 40,
        "the claims table has only {} rows",
        rows.len()
    );
    let mut problems = Vec::new();
    for r in &rows {
        if r.guards.is_empty() {
            problems.push(format!("{}: no guard named", r.id));
        }
        if r.tests.is_empty() {
            problems.push(format!("{}: no test named", r.id));
        }
        for (file, symbol) in &r.guards {
            if !defines(file, symbol) {
                problems.push(format!(
                    "{}: guard {file}::{symbol} is not defined there",
                    r.id
                ));
            }
        }
        for (file, name) in &r.tests {
            if !has_test(file, name) {
                problems.push(format!("{}: test {file}::{name} does not exist", r.id));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/claims.md cites what is not there:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checks_catch_a_missing_symbol_and_a_function_that_is_not_a_test() {
    // The checks must be able to fail: a name nobody defines, and a helper of a test file
    // that is a function but not a test.
    assert!(!defines(
        "src/operation/decide.rs",
        "no_such_guard_anywhere"
    ));
    assert!(defines("src/operation/decide.rs", "after_dispatch"));
    assert!(defines("remote-scripts/shim/60-run.sh", "verb_run"));
    assert!(!defines("remote-scripts/shim/60-run.sh", "verb_ru"));
    // A shim function is cited in the part that defines it, not any part.
    assert!(!defines("remote-scripts/shim/10-helpers.sh", "verb_run"));
    assert!(has_test(
        "tests/it/run.rs",
        "thirty_two_concurrent_runs_of_one_op_execute_once"
    ));
    assert!(!has_test("tests/it/run.rs", "effects"));
    assert!(!has_test("tests/it/nowhere.rs", "anything"));
}
