//! How an operator command (`probe`, `resolve`, `cancel`, `gc`) shows a host change
//! ([`crate::ops::host_changed`]): as `run` shows its `conflict`/`host_changed` verdict,
//! the document with `--json`, else `opmark: conflict: REASON` on stderr; exit 243.

use super::common;
use crate::cli::GlobalArgs;
use crate::error::Result;
use crate::ops::host_changed::HostChanged;

/// Renders the host change; returns the exit status.
pub fn render(global: &GlobalArgs, changed: &HostChanged) -> Result<u8> {
    if global.json {
        common::print_json(changed)?;
    } else {
        crate::logging::say(format_args!(
            "opmark: {}: {}",
            changed.verdict, changed.reason
        ));
    }
    Ok(changed.exit_status())
}
