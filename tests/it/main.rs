//! The integration test binary: one binary, one module per area, real sshd targets.

mod support;

mod approvals;
mod architecture;
mod architecture_docs;
mod cancel;
mod chaos;
mod claims;
mod cli;
mod docker;
mod fleet;
mod health;
mod hosts;
mod identity;
mod integrity;
mod json;
mod keeper;
mod ledger;
mod login;
mod matrix;
mod mcp;
mod observations;
mod operators;
mod policy;
mod redaction;
mod repetitions;
mod resident;
mod run;
mod screens;
mod shim;
mod speed;
mod ssh_config;
mod targets;
mod transport;
mod ux;
mod vocabulary;
