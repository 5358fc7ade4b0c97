//! `opmark list`: the ledger's operations, most recently active first. Unresolved
//! operations are marked `!`, contradicted ones (SPEC section 3) `C`.

use crate::cli::{GlobalArgs, ListArgs};
use crate::error::{exit_code, Result};
use crate::ledger::{Ledger, ListFilter, OperationRecord, Redactor};

/// Prints the operations as a table, or one JSON document with `--json`.
pub fn run(global: &GlobalArgs, args: &ListArgs) -> Result<u8> {
    let (ledger, _path) =
        Ledger::open_existing_default_or(global.ledger.as_deref(), global.ledger_key.as_deref())
            .map_err(|e| redacted_error(e.into()))?;
    let filter = ListFilter {
        unresolved: args.unresolved,
        host: args.host.clone(),
        limit: None,
    };
    let ops = match &ledger {
        Some(l) => l.list(&filter).map_err(|e| redacted_error(e.into()))?,
        None => Vec::new(),
    };
    if global.json {
        super::common::print_json(&serde_json::json!({ "operations": ops }))?;
    } else {
        print!("{}", table(&ops, args.unresolved));
    }
    Ok(exit_code::OK)
}

/// Masks secrets in an error message at the command edge (errors may echo user input).
pub(crate) fn redacted_error(mut e: crate::error::Error) -> crate::error::Error {
    e.message = Redactor::default().redact_owned(&e.message);
    e
}

/// `s` with control characters escaped, so stored text cannot drive the terminal.
pub(crate) fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Cuts `s` to `width` characters, marking the cut with `…`.
pub(crate) fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// `2024-05-01T10:00:00.123456Z` → `2024-05-01 10:00:00`.
pub(crate) fn to_second(at: &str) -> String {
    at.get(..19).unwrap_or(at).replace('T', " ")
}

fn table(ops: &[OperationRecord], only_unresolved: bool) -> String {
    if ops.is_empty() {
        return if only_unresolved {
            "no unresolved operations\n".to_owned()
        } else {
            "no operations recorded\n".to_owned()
        };
    }
    let col = |f: &dyn Fn(&OperationRecord) -> usize, min: usize, max: usize| {
        ops.iter().map(f).max().unwrap_or(0).clamp(min, max)
    };
    let op_w = col(&|o| o.op_id.chars().count(), 5, 28);
    let host_w = col(&|o| o.host.chars().count(), 4, 14);
    let state_w = col(&|o| o.state.chars().count(), 5, 16);
    let mut out = format!(
        "   {:op_w$} {:host_w$} {:11} {:state_w$} {:>4} UPDATED (UTC)\n",
        "OP", "HOST", "FAMILY", "STATE", "EXIT"
    );
    for o in ops {
        let exit = o.exit_code.map_or("-".to_owned(), |c| c.to_string());
        out.push_str(&format!(
            "{}{} {:op_w$} {:host_w$} {:11} {:state_w$} {:>4} {}\n",
            if o.unresolved { "!" } else { " " },
            if o.contradictions > 0 { "C" } else { " " },
            fit(&printable(&o.op_id), op_w),
            fit(&printable(&o.host), host_w),
            o.family.as_str(),
            fit(&printable(&o.state), state_w),
            exit,
            to_second(&o.updated_at).get(5..16).unwrap_or(""),
        ));
    }
    let unresolved = ops.iter().filter(|o| o.unresolved).count();
    out.push_str(&format!(
        "{} operation{}, {unresolved} unresolved (marked !)",
        ops.len(),
        if ops.len() == 1 { "" } else { "s" }
    ));
    let contradicted = ops.iter().filter(|o| o.contradictions > 0).count();
    if contradicted > 0 {
        // Only when present, so the common footer stays as it was.
        out.push_str(&format!(
            ", {contradicted} CONTRADICTED (marked C; `opmark show OP` says how)"
        ));
    }
    out.push('\n');
    out
}
