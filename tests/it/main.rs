//! The integration test binary: one binary, one module per area, real sshd targets.

mod support;

mod chaos;
mod cli;
mod hosts;
mod ledger;
mod operators;
mod policy;
mod run;
mod shim;
mod targets;
mod transport;
