//! The published JSON Schemas (schemas/) as MCP output schemas: each bundled into one
//! self-contained document, since a client resolves no other file (the official Python
//! SDK validates every result against its tool's output schema with an empty registry).

use serde_json::Value;

/// Every published schema, by the name of its file (`NAME.schema.json`).
const PUBLISHED: &[(&str, &str)] = &[
    ("run", include_str!("../../schemas/run.schema.json")),
    ("fleet", include_str!("../../schemas/fleet.schema.json")),
    ("probe", include_str!("../../schemas/probe.schema.json")),
    ("output", include_str!("../../schemas/output.schema.json")),
    ("plan", include_str!("../../schemas/plan.schema.json")),
    ("show", include_str!("../../schemas/show.schema.json")),
    ("list", include_str!("../../schemas/list.schema.json")),
    (
        "reconcile",
        include_str!("../../schemas/reconcile.schema.json"),
    ),
    ("cancel", include_str!("../../schemas/cancel.schema.json")),
    ("resolve", include_str!("../../schemas/resolve.schema.json")),
    ("stats", include_str!("../../schemas/stats.schema.json")),
    ("error", include_str!("../../schemas/error.schema.json")),
];

/// The published schema `name`, parsed.
fn published(name: &str) -> Value {
    let (_, text) = PUBLISHED
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no published schema {name}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("schemas/{name}.schema.json: {e}"))
}

/// Schema `name` with every `$ref` into another file (`list.schema.json#/$defs/operation`)
/// replaced by a reference to a copy of that definition in its own `$defs`
/// (`#/$defs/list.operation`), recursively; `$id` is dropped so that the references
/// resolve within the document.
pub(super) fn bundled(name: &str) -> Value {
    let mut root = published(name);
    if let Value::Object(map) = &mut root {
        map.remove("$id");
    }
    // Definitions to copy in: (file, definition).
    let mut wanted: Vec<(String, String)> = Vec::new();
    rewrite_refs(&mut root, None, &mut wanted);
    let mut copied: Vec<(String, String)> = Vec::new();
    while let Some((file, def)) = wanted.pop() {
        if copied.contains(&(file.clone(), def.clone())) {
            continue;
        }
        let mut body = if def.is_empty() {
            // The whole document (fleet's hosts are run documents); its own definitions
            // come in one by one as its references name them.
            let mut whole = published(&file);
            if let Value::Object(map) = &mut whole {
                for key in ["$schema", "$id", "$defs"] {
                    map.remove(key);
                }
            }
            whole
        } else {
            published(&file)["$defs"][&def].clone()
        };
        assert!(!body.is_null(), "{file}.schema.json has no $defs/{def}");
        rewrite_refs(&mut body, Some(&file), &mut wanted);
        let defs = root
            .as_object_mut()
            .expect("a schema is an object")
            .entry("$defs")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        defs.as_object_mut()
            .expect("$defs is an object")
            .insert(bundled_name(&file, &def), body);
        copied.push((file, def));
    }
    root
}

/// Rewrites the `$ref`s under `value`, found in file `within` (None: the root document),
/// to the bundled names, noting which definitions must be copied in.
fn rewrite_refs(value: &mut Value, within: Option<&str>, wanted: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get_mut("$ref") {
                let (file, pointer) = match target.split_once('#') {
                    Some(("", pointer)) => (within.map(str::to_owned), pointer.to_owned()),
                    Some((file, pointer)) => (
                        Some(file.trim_end_matches(".schema.json").to_owned()),
                        pointer.to_owned(),
                    ),
                    None => (
                        Some(target.trim_end_matches(".schema.json").to_owned()),
                        String::new(),
                    ),
                };
                if let Some(file) = file {
                    let def = match pointer.as_str() {
                        "" => String::new(),
                        p => p
                            .strip_prefix("/$defs/")
                            .unwrap_or_else(|| panic!("unsupported $ref {target}"))
                            .to_owned(),
                    };
                    *target = format!("#/$defs/{}", bundled_name(&file, &def));
                    wanted.push((file, def));
                }
            }
            for v in map.values_mut() {
                rewrite_refs(v, within, wanted);
            }
        }
        Value::Array(items) => {
            for v in items {
                rewrite_refs(v, within, wanted);
            }
        }
        _ => {}
    }
}

/// The name in `$defs` of definition `def` of file `file` (the whole file when `def` is
/// empty).
fn bundled_name(file: &str, def: &str) -> String {
    if def.is_empty() {
        file.to_owned()
    } else {
        format!("{file}.{def}")
    }
}

/// Adds `fields` (optional) to every closed document object of `schema`: the objects whose
/// properties include `schema` (the document's own version field), at the root, in a
/// branch or in a definition.
pub(super) fn add_document_fields(schema: &mut Value, fields: &[(&str, Value)]) {
    match schema {
        Value::Object(map) => {
            let is_document = map
                .get("properties")
                .and_then(Value::as_object)
                .is_some_and(|p| p.contains_key("schema"));
            if is_document {
                let props = map
                    .get_mut("properties")
                    .and_then(Value::as_object_mut)
                    .expect("checked above");
                for (name, field) in fields {
                    props
                        .entry(name.to_string())
                        .or_insert_with(|| field.clone());
                }
            }
            for (key, v) in map.iter_mut() {
                if key != "properties" {
                    add_document_fields(v, fields);
                }
            }
        }
        Value::Array(items) => {
            for v in items {
                add_document_fields(v, fields);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `$ref` under `value`.
    fn refs(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get("$ref") {
                    out.push(r.clone());
                }
                map.values().for_each(|v| refs(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn every_bundled_schema_resolves_each_reference_within_itself() {
        for (name, _) in PUBLISHED {
            let schema = bundled(name);
            let mut found = Vec::new();
            refs(&schema, &mut found);
            for r in found {
                let pointer = r
                    .strip_prefix('#')
                    .unwrap_or_else(|| panic!("{name}: {r} points outside the document"));
                // `list.operation` is one key: JSON pointers split on `/` only.
                assert!(
                    schema.pointer(pointer).is_some(),
                    "{name}: {r} does not resolve"
                );
            }
        }
    }

    #[test]
    fn added_fields_reach_every_closed_document_object() {
        let mut schema = bundled("probe");
        add_document_fields(&mut schema, &[("exit_status", serde_json::json!({}))]);
        let report = &schema["oneOf"][0]["properties"];
        assert!(report.get("exit_status").is_some(), "{report}");
        let changed = &schema["$defs"]["host_changed"]["properties"];
        assert!(changed.get("exit_status").is_some(), "{changed}");
    }
}
