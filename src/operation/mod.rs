//! One operation's lifecycle (docs/decisions.md): classify, record the intent,
//! dispatch attempts through the shim, and, after a lost connection, probe the marker
//! before anything else. Read top-down:
//!
//! - this file: the public surface, re-exported from the leaves below it: what a run is
//!   given (`input`: [`RunInput`], [`RunEnv`]), what it answers (`report`: [`RunReport`]),
//!   and [`run`] itself (`run`: the steps before the first dispatch, the policy gate, the
//!   ledger conflict and operator decisions);
//! - [`decide`]: THE decision table. Every retry and every verdict is decided there, by
//!   pure functions of what the run knows and what it just observed; its header maps
//!   the rows of docs/decisions.md#after-a-lost-connection and the verdict rules to code, and each is a unit test;
//! - `driver`: the I/O around the table (connect, call the shim through [`crate::host`],
//!   probe, follow, record in the ledger, pause), which asks [`decide`] at every step;
//! - [`reply`]: the shim's answer to a `run` call, read once into types (refusal reasons
//!   as an enum) for [`decide`];
//! - [`record`]: the ledger as a run writes it (strict before dispatch, verdict-preserving
//!   after);
//! - [`interrupt`]: SIGINT/SIGTERM/SIGHUP to the client, answered by [`run_interruptible`];
//! - [`output`]: the caller's view of the output (offsets for re-attach, digests);
//! - [`identity`]: which machine an operation ran on, and the host key check;
//! - [`fleet`]: one operation on many hosts (docs/decisions.md#fleets): forks, failure budget,
//!   rolling batches, the combined answer (its hosts' writes before dispatch share one
//!   commit, `commit_group`);
//! - [`reconcile`]: what later evidence settles, for `opmark reconcile`.

mod commit_group;
pub mod decide;
mod driver;
pub mod fleet;
pub mod identity;
mod input;
pub mod interrupt;
pub mod output;
pub mod plan;
pub mod reconcile;
pub mod record;
pub mod repeat;
pub mod reply;
mod report;
mod run;

pub use decide::{connect_code, AttemptSummary};
pub(crate) use input::family_and_rule;
pub use input::{RunEnv, RunInput, StdinFile, WaitScope, DEFAULT_WAIT, LAST_LOOK};
pub use report::{progress, ObservationReport, RunError, RunReport};
pub use run::{run, run_interruptible};
