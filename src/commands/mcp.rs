//! `opmark mcp`: serve the Model Context Protocol on stdio (the server is in `mcp/`).

use super::common;
use crate::cli::{GlobalArgs, McpArgs};
use crate::error::{exit_code, Result};

/// Serves until the client closes stdin.
pub fn run(global: &GlobalArgs, args: &McpArgs) -> Result<u8> {
    // stdin is the protocol stream and nobody sits at a terminal: never ask.
    crate::host::forbid_prompts();
    // Tool threads blocked on a host do not hold the exit once the client is gone: the
    // runtime is never dropped, so nothing waits for them.
    let secrets = crate::secret::Spec::parse_all(&args.secrets).map_err(|e| {
        crate::error::Error::new(
            crate::error::ErrorKind::InvalidInput,
            format!("{e}; the server did not start"),
        )
    })?;
    common::block_on(crate::mcp::serve(
        common::context(global),
        args.max_output,
        secrets,
    ))??;
    Ok(exit_code::OK)
}
