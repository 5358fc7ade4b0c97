//! Documents checked against the JSON Schemas in `schemas/` by a validator this project
//! did not write (python3's `jsonschema`).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::{fresh_dir, skip_or_fail, text};

/// python3: validates `[{schema, docs}]` (argv[1]) with every schema in argv[2] registered
/// under its `$id`, so `$ref`s between them resolve without a network.
const VALIDATE_PY: &str = r#"
import json, pathlib, sys
try:
    import jsonschema
    from referencing import Registry, Resource
except ImportError:
    sys.exit(77)
registry = Registry()
for path in sorted(pathlib.Path(sys.argv[2]).glob("*.schema.json")):
    schema = json.load(open(path))
    jsonschema.Draft202012Validator.check_schema(schema)
    registry = registry.with_resource(schema["$id"], Resource.from_contents(schema))
bad = 0
for pair in json.load(open(sys.argv[1])):
    schema = json.load(open(pair["schema"]))
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    for doc in pair["docs"]:
        for e in validator.iter_errors(doc):
            bad += 1
            where = "/".join(str(p) for p in e.absolute_path)
            print(pathlib.Path(pair["schema"]).name, where, e.message[:300], "in", json.dumps(doc)[:300], file=sys.stderr)
sys.exit(1 if bad else 0)
"#;

/// Validates each `(schema, documents)` pair against `schemas/<schema>.schema.json` with
/// python3's `jsonschema` (Draft 2020-12, the schema itself checked first). Panics naming
/// the schema, the document and the violation; a missing `jsonschema` module is a skip
/// (false) locally and a failure in CI.
pub fn validate(test: &str, sets: &[(&str, Vec<Value>)]) -> bool {
    let dir = fresh_dir(test);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas");
    let mut pairs = Vec::new();
    for (name, docs) in sets {
        let schema = root.join(format!("{name}.schema.json"));
        assert!(schema.exists(), "no schema {}", schema.display());
        pairs.push(serde_json::json!({ "schema": schema, "docs": docs }));
    }
    let file = dir.join("docs.json");
    std::fs::write(&file, serde_json::to_string(&pairs).unwrap()).unwrap();
    let out = Command::new("python3")
        .arg("-c")
        .arg(VALIDATE_PY)
        .arg(&file)
        .arg(&root)
        .output()
        .unwrap();
    if out.status.code() == Some(77) {
        skip_or_fail(test, "python3 module jsonschema");
        return false;
    }
    assert!(
        out.status.success(),
        "documents that break their schema:\n{}",
        text(&out.stderr)
    );
    true
}
