//! `opmark classify`: the family of a command and the rule that decided each part.

use crate::cli::{ClassifyArgs, GlobalArgs};
use crate::error::Result;
use crate::ledger::Redactor;
use crate::policy::{Classification, Policy};

/// Classifies the command words (joined by spaces, as `run` would send them) and prints
/// the result; exit 0 even when the command would be denied (classifying is not running).
pub fn run(global: &GlobalArgs, args: &ClassifyArgs) -> Result<u8> {
    let policy = Policy::load(global.policy.as_deref())?;
    let command = args.command.join(" ");
    let mut c = policy.classify(&command);
    // What is printed may end up in a terminal log or an agent's transcript: mask
    // secrets as the ledger does, each part with what the whole command reveals.
    let redactor = Redactor::with_patterns(policy.redact_patterns());
    for part in &mut c.parts {
        part.command = redactor.redact_part(&command, &part.command);
    }
    if let Some(e) = &mut c.parse_error {
        *e = redactor.redact_part(&command, e);
    }
    let command = redactor.redact_owned(&command);
    if global.json {
        super::common::print_json(&c)?;
    } else {
        crate::out!("{}", render(&command, &c, policy.origin()));
    }
    Ok(crate::error::exit_code::OK)
}

/// The human-readable report.
fn render(command: &str, c: &Classification, origin: &str) -> String {
    let mut out = format!("{}: {command}\n", c.family);
    for part in &c.parts {
        // Brackets, since a named rule already ends in `(name)`.
        out.push_str(&format!(
            "  {:<12} {}  [{}]\n",
            part.family.as_str(),
            part.command,
            part.rule
        ));
    }
    if let Some(e) = &c.parse_error {
        out.push_str(&format!("parse error: {e}\n"));
    }
    if let Some(rule) = &c.deny {
        out.push_str(&format!(
            "denied by {rule}: `opmark run` refuses this command\n"
        ));
    }
    if let Some(rule) = &c.approval {
        out.push_str(&format!(
            "approval required by {rule}: `opmark run` needs --approve NOTE\n"
        ));
    }
    out.push_str(&format!("policy: {origin}\n"));
    out
}
