//! opmark: run remote commands over SSH so that one logical operation produces at most
//! one execution on its host.
//!
//! Module map (see docs/architecture.md#architecture):
//! - [`ops`]: the library's operations (run, probe, output, show, list, reconcile, cancel...):
//!   a typed request in, a typed report out, no printing; the CLI and MCP render them.
//! - [`cli`], [`commands`]: the command line and one file per subcommand: args to a
//!   request, one call into [`ops`], the report rendered (stdout only through
//!   `commands::render::Out`).
//! - [`text`]: stored text as people read it (escaped, cut, times to the second).
//! - [`error`]: error kinds and the reserved exit codes.
//! - [`host`]: the host protocol: connect, call one shim verb, read its typed answer.
//! - [`shim`]: the wire below it: the script (assembled from `remote-scripts/shim/`), its
//!   verb table, the exec request, the frame parser.
//! - [`ssh`]: the russh transport: host resolution, host keys, authentication, exec, and
//!   the connection keeper that reuses connections across processes.
//! - [`policy`]: `command-classes.toml` and the shell-aware classifier.
//! - [`approval`]: signed approvals (SSHSIG statements an agent cannot make).
//! - [`ledger`]: the local SQLite record: events, hash chain, fingerprints.
//! - [`redact`]: secret masking, used by the ledger, `op_id`, `policy` and error messages.
//! - [`paths`]: the user's home and XDG directories (the ledger's and the keeper's files).
//! - [`operation`]: one operation's lifecycle: attempts, probes, retries, verdicts.
//! - [`lab`]: disposable local sshd targets for tests, demos and users.
//! - [`mcp`]: `opmark mcp`, the Model Context Protocol server over [`ops`].
//! - [`fault`]: crash points for the tests (feature `test-hooks`; nothing otherwise).

pub mod approval;
pub mod cli;
pub mod commands;
pub mod duration;
pub mod error;
pub mod family;
pub mod fault;
pub mod host;
pub mod host_lock;
pub mod lab;
pub mod ledger;
pub mod logging;
pub mod mcp;
pub mod op_id;
pub mod operation;
pub mod ops;
pub mod paths;
pub mod policy;
pub mod redact;
pub mod secret;
pub mod shim;
pub mod ssh;
pub mod text;
pub mod vocab;
