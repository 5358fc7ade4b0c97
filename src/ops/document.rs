//! A report as the contract's JSON document (docs/guarantees.md#the-command-line-contract): what the CLI prints with
//! `--json` and what the MCP server hands its client, byte for byte the same.

use crate::error::{Error, ErrorKind, Result};

/// The `schema` field of every JSON document (docs/guarantees.md#the-command-line-contract); bumped only when a field
/// changes meaning or disappears. `opmark/2`: one vocabulary (a plural is a list, a count
/// is `<noun>_count`, the marker's state is `marker_state`), see docs/agents.md#agents-the-json-contract-opmark2--q-opmark-mcp.
pub const SCHEMA: &str = "opmark/2";

/// `value` as the contract's document: a JSON object with `schema` set.
pub fn json_document(value: &impl serde::Serialize) -> Result<serde_json::Value> {
    let mut doc = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::Internal, format!("cannot encode JSON: {e}")))?;
    match &mut doc {
        serde_json::Value::Object(map) => {
            map.insert("schema".to_owned(), SCHEMA.into());
        }
        _ => {
            return Err(Error::new(
                ErrorKind::Internal,
                "a JSON document must be an object (opmark bug)",
            ))
        }
    }
    Ok(doc)
}

/// The JSON document of an error: `error.reason_code`, `error.message` and
/// `error.retryable`; the exit code stays the kind's.
pub fn error_document(err: &Error) -> serde_json::Value {
    serde_json::json!({
        "schema": SCHEMA,
        "error": {
            "reason_code": err.reason_code(),
            "message": err.message,
            "retryable": err.retryable(),
        }
    })
}
