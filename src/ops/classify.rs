//! Classify: the family of a command and the rule that decided each part, with secrets
//! masked as the ledger masks them (what is shown may end up in a terminal log or an
//! agent's transcript).

use super::Context;
use crate::error::Result;
use crate::policy::{Classification, Policy};
use crate::redact::Redactor;

/// A command's classification under the policy in effect.
#[derive(Debug, Clone)]
pub struct ClassifyReport {
    /// The command as classified, redacted.
    pub command: String,
    /// The classification, its parts redacted with what the whole command reveals.
    pub classification: Classification,
    /// Where the policy came from.
    pub origin: String,
}

/// Classifies `words` joined by spaces, as `run` would send them.
pub fn classify(ctx: &Context, words: &[String]) -> Result<ClassifyReport> {
    let policy = Policy::load(ctx.policy.as_deref())?;
    let command = words.join(" ");
    let mut c = policy.classify(&command);
    let redactor = Redactor::with_patterns(policy.redact_patterns());
    for part in &mut c.parts {
        part.command = redactor.redact_part(&command, &part.command);
    }
    if let Some(e) = &mut c.parse_error {
        *e = redactor.redact_part(&command, e);
    }
    Ok(ClassifyReport {
        command: redactor.redact_owned(&command),
        classification: c,
        origin: policy.origin().to_owned(),
    })
}
