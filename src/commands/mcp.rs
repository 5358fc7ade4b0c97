//! `opmark mcp`: serve the Model Context Protocol on stdio (the server is in `mcp/`).

use super::common;
use crate::cli::{GlobalArgs, McpArgs};
use crate::error::{exit_code, Result};

/// Serves until the client closes stdin.
pub fn run(global: &GlobalArgs, args: &McpArgs) -> Result<u8> {
    // stdin is the protocol stream and nobody sits at a terminal: never ask.
    crate::ssh::auth::forbid_prompts();
    let runtime = common::runtime()?;
    runtime.block_on(crate::mcp::serve(global.clone(), args.max_output))?;
    // Tool threads blocked on a host must not hold the exit once the client is gone.
    runtime.shutdown_background();
    Ok(exit_code::OK)
}
