//! One vocabulary (docs/guarantees.md#the-command-line-contract): a field name has one
//! JSON type in every document opmark writes, the CLI's and the MCP server's alike (a
//! plural is a list, a count is `<noun>_count`), and every `reason_code` comes from the
//! one list in src/vocab.rs.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

use crate::support::mcp::McpClient;
use crate::support::Sealed;

/// Objects whose keys are data (states, families, verdicts), not field names.
const DICTIONARIES: &[&str] = &["by_state", "by_family", "verdicts", "retries_by_family"];

/// The JSON type of a value, integers and fractions both `number`.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every field under `value`: name → type → one place it was seen (`doc:path`).
fn fields(
    value: &Value,
    path: &str,
    seen: &mut BTreeMap<String, BTreeMap<&'static str, String>>,
    codes: &mut Vec<(String, String)>,
) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                let at = format!("{path}.{key}");
                if key == "reason_code" {
                    if let Some(code) = v.as_str() {
                        codes.push((code.to_owned(), at.clone()));
                    }
                }
                if !v.is_null() {
                    seen.entry(key.clone())
                        .or_default()
                        .entry(kind(v))
                        .or_insert_with(|| at.clone());
                }
                if !DICTIONARIES.contains(&key.as_str()) {
                    fields(v, &at, seen, codes);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                fields(v, &format!("{path}[{i}]"), seen, codes);
            }
        }
        _ => {}
    }
}

/// The structured content of MCP tool results against the same lab: each tool once, a
/// tool error, an argument error.
fn mcp_documents(env: &Sealed, lab: &opmark::lab::Lab) -> Vec<(String, Value)> {
    let mut cmd = env.opmark_with_lab(lab);
    cmd.arg("mcp");
    let mut client = McpClient::start(cmd);
    let t1 = lab.targets()[1].alias.clone();
    let calls = [
        (
            "run",
            serde_json::json!({"host": t1, "op_id": "voc-1", "command": "echo hi"}),
        ),
        ("probe", serde_json::json!({"host": t1, "op_id": "voc-1"})),
        ("show", serde_json::json!({"op_id": "voc-1"})),
        ("list", serde_json::json!({"unresolved": false, "limit": 5})),
        ("reconcile", serde_json::json!({})),
        ("cancel", serde_json::json!({"host": t1, "op_id": "voc-1"})),
        ("show", serde_json::json!({"op_id": "never-ran"})),
        ("run", serde_json::json!({"host": t1, "command": "true"})),
    ];
    let mut docs = Vec::new();
    for (tool, args) in calls {
        docs.push((format!("mcp {tool}"), client.structured(tool, args)));
    }
    client.close();
    docs
}

#[test]
fn every_field_has_one_type_in_every_document_and_reason_codes_come_from_one_list() {
    let Some(lab) = crate::loopback_lab!(2) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let mut docs: Vec<(String, Value)> = Vec::new();
    for (schema, set) in crate::json::every_document(&lab, &env) {
        docs.extend(set.into_iter().map(|d| (schema.to_owned(), d)));
    }
    docs.extend(mcp_documents(&env, &lab));
    let mut seen = BTreeMap::new();
    let mut codes = Vec::new();
    for (i, (name, doc)) in docs.iter().enumerate() {
        fields(doc, &format!("{name}#{i}"), &mut seen, &mut codes);
    }
    // Sanity: the documents hold the fields this test is about.
    for field in [
        "attempts",
        "attempt_count",
        "stdout_bytes",
        "marker_state",
        "state",
    ] {
        assert!(seen.contains_key(field), "no document has `{field}`");
    }
    let mixed: Vec<String> = seen
        .iter()
        .filter(|(_, kinds)| kinds.len() > 1)
        .map(|(name, kinds)| format!("`{name}`: {kinds:?}"))
        .collect();
    assert!(
        mixed.is_empty(),
        "fields with more than one JSON type across documents:\n{}",
        mixed.join("\n")
    );
    let known: BTreeSet<&str> = opmark::vocab::ReasonCode::ALL
        .iter()
        .map(|c| c.as_str())
        .chain(opmark::vocab::ErrorCode::OWN.iter().map(|c| c.as_str()))
        .collect();
    let strangers: Vec<&(String, String)> = codes
        .iter()
        .filter(|(code, _)| !known.contains(code.as_str()))
        .collect();
    assert!(
        strangers.is_empty(),
        "reason codes not in src/vocab.rs: {strangers:?}"
    );
}
