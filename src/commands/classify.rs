//! `opmark classify`: the family of a command and the rule that decided each part.

use crate::cli::{ClassifyArgs, GlobalArgs};
use crate::error::Result;
use crate::policy::Classification;

/// Classifies the command words ([`crate::ops::classify`]) and prints the result; exit 0
/// even when the command would be denied (classifying is not running).
pub fn run(global: &GlobalArgs, args: &ClassifyArgs) -> Result<u8> {
    let report = crate::ops::classify::classify(&super::common::context(global), &args.command)?;
    if global.json {
        super::common::print_json(&report.classification)?;
    } else {
        crate::out!(
            "{}",
            render(&report.command, &report.classification, &report.origin)
        );
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
    if !c.locks.is_empty() {
        let locks: Vec<String> = c.locks.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "host locks: {} (`opmark run` holds them while it runs; see --lock-wait)\n",
            locks.join(", ")
        ));
    }
    out.push_str(&format!("policy: {origin}\n"));
    out
}
