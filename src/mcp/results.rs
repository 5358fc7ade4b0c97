//! What a tool call answers: an error as the CLI's error document, and a run document
//! cut to the client's output budget with the digests and the way to read the rest.

use serde_json::Value;
use sha2::{Digest, Sha256};

use rmcp::model::CallToolResult;

use crate::error::Error;
use crate::ops::document::error_document;

/// An error as the CLI's error document, marked as a tool error.
pub(super) fn error_result(e: &Error) -> CallToolResult {
    CallToolResult::structured_error(error_document(e))
}

/// Cuts `stdout` and `stderr` of a run document (and of each host's in a fleet document)
/// to `budget` bytes each: the head (3/4) and the tail (1/4) at character boundaries,
/// joined by one line saying which bytes were left out and how to read them. Adds
/// `<stream>_bytes`, `<stream>_sha256` (of the whole text as the CLI returns it),
/// `<stream>_truncated`, and, when cut, `<stream>_left_out` (`from`, `to`) and
/// `output_rest`.
pub(super) fn cut_output(mut result: CallToolResult, budget: usize) -> CallToolResult {
    let Some(Value::Object(doc)) = result.structured_content.as_mut() else {
        return result;
    };
    let mut cut_any = cut_streams(doc, budget);
    if let Some(Value::Array(hosts)) = doc.get_mut("hosts") {
        for host in hosts {
            if let Value::Object(host) = host {
                cut_any |= cut_streams(host, budget);
            }
        }
    }
    if cut_any {
        doc.insert(
            "output_rest".to_owned(),
            format!(
                "output cut to {budget} bytes per stream (head and tail); the `output` tool reads any part of it (op_id, host, stream, range as each cut line names it) without running anything"
            )
            .into(),
        );
    }
    let text = Value::Object(doc.clone()).to_string();
    result.content = vec![rmcp::model::ContentBlock::text(text)];
    result
}

/// [`cut_output`] for one document's streams; whether it cut one.
pub(super) fn cut_streams(doc: &mut serde_json::Map<String, Value>, budget: usize) -> bool {
    let op = doc
        .get("op_id")
        .and_then(Value::as_str)
        .unwrap_or("OP")
        .to_owned();
    let host = doc
        .get("host")
        .and_then(Value::as_str)
        .unwrap_or("HOST")
        .to_owned();
    // A replay from the host's capped copy returns the kept bytes; a live run returns the
    // whole stream, of which the host kept all but `dropped`.
    let replayed_copy = doc.get("truncated").and_then(Value::as_bool) == Some(true);
    let mut cut_any = false;
    for (i, stream) in ["stdout", "stderr"].into_iter().enumerate() {
        let Some(Value::String(text)) = doc.get(stream).cloned() else {
            continue;
        };
        let digest = hex::encode(Sha256::digest(text.as_bytes()));
        let total = text.len();
        let truncated = total > budget;
        let kept = if truncated {
            let mut head_end = budget * 3 / 4;
            while !text.is_char_boundary(head_end) {
                head_end -= 1;
            }
            let mut tail_start = total - (budget - budget * 3 / 4);
            while !text.is_char_boundary(tail_start) {
                tail_start += 1;
            }
            let dropped = doc
                .get("dropped")
                .and_then(|d| d.get(i))
                .and_then(Value::as_u64)
                .unwrap_or(0);
            let readable = if dropped > 0 && !replayed_copy {
                format!(
                    "; the host kept only bytes 0-{} (the run's output cap), the rest cannot be read back",
                    (total as u64).saturating_sub(dropped)
                )
            } else {
                String::new()
            };
            doc.insert(
                format!("{stream}_left_out"),
                serde_json::json!({"from": head_end, "to": tail_start}),
            );
            format!(
                "{}\n[opmark: {} bytes of {stream} left out here, bytes {head_end}-{tail_start} of {total}; read them with the output tool: op_id \"{op}\", host \"{host}\", stream \"{stream}\", range \"{head_end}-{tail_start}\"{readable}]\n{}",
                &text[..head_end],
                tail_start - head_end,
                &text[tail_start..]
            )
        } else {
            text.clone()
        };
        cut_any |= truncated;
        doc.insert(stream.to_owned(), kept.into());
        doc.insert(format!("{stream}_bytes"), total.into());
        doc.insert(format!("{stream}_sha256"), digest.into());
        doc.insert(format!("{stream}_truncated"), truncated.into());
    }
    cut_any
}
