//! `opmark policy show`: the command-classes policy in effect and where it comes from,
//! as TOML a user can copy and edit, or as one JSON document.

use crate::cli::{GlobalArgs, PolicyAction, PolicyArgs};
use crate::error::{exit_code, Result};

/// Prints the policy chosen the way `run` chooses it (`--policy`, the user's file, or
/// the built-in one).
pub fn run(global: &GlobalArgs, args: &PolicyArgs) -> Result<u8> {
    match args.action {
        PolicyAction::Show => show(global),
    }
}

fn show(global: &GlobalArgs) -> Result<u8> {
    let policy = super::common::load_policy(global)?;
    let (source, path) = if policy.is_builtin() {
        ("built-in", None)
    } else {
        ("file", Some(policy.origin()))
    };
    // Who can lift a hold (docs/trust.md#the-approval-flow).
    let approvers = crate::approval::required(&policy);
    let approvals = match &approvers {
        Some(file) => format!(
            "signed: only an approval made with `opmark approve` by a key in {} counts",
            file.display()
        ),
        None => "self-service: `opmark run --approve NOTE` lifts a hold, by whoever runs it (an agent \
                 too); name an allowed_signers file with `approvers = \"PATH\"` to require signed ones"
            .to_owned(),
    };
    if global.json {
        super::common::print_json(&serde_json::json!({
            "source": source,
            "path": path,
            "approvals": if approvers.is_some() { "signed" } else { "self_service" },
            "approvers": approvers.as_ref().map(|p| p.display().to_string()),
            "policy": policy.document(),
        }))?;
    } else {
        let from = path.map_or_else(
            || format!("the {}", crate::policy::BUILTIN_ORIGIN),
            |p| p.to_owned(),
        );
        crate::out!(
            "# The command-classes policy in effect, from {from}.\n\
             # Approvals: {approvals}.\n\
             # Rules are numbered from 1 in this order; a rule is referred to as `#N (name)`.\n\
             # Save this as ~/.config/opmark/command-classes.toml to start your own.\n\n{}",
            policy.to_toml()
        );
    }
    Ok(exit_code::OK)
}
