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
    if global.json {
        super::common::print_json(&serde_json::json!({
            "source": source,
            "path": path,
            "policy": policy.document(),
        }))?;
    } else {
        let from = path.map_or_else(
            || format!("the {}", crate::policy::BUILTIN_ORIGIN),
            |p| p.to_owned(),
        );
        crate::out!(
            "# The command-classes policy in effect, from {from}.\n\
             # Rules are numbered from 1 in this order; a rule is referred to as `#N (name)`.\n\
             # Save this as ~/.config/opmark/command-classes.toml to start your own.\n\n{}",
            policy.to_toml()
        );
    }
    Ok(exit_code::OK)
}
