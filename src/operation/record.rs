//! The ledger as one `run` writes it, before and after dispatch (docs/ledger.md#writes-before-and-after-dispatch).
//!
//! Before dispatch every failed write is an error: nothing may leave this machine
//! unrecorded. After dispatch the command may be running or done on the host, so a failed
//! write (the ledger's disk filled up) must not cost the caller the verdict: the first
//! failure is kept, every later write of this run is skipped, and the report carries it as
//! `ledger_error`. Skipping keeps the ledger's story honest: it stops at "dispatched",
//! unresolved, and a rerun with the same op id probes the marker and replays from the host.

use serde::Serialize;

use crate::ledger::event::ClaimSeen;
use crate::ledger::{Durability, Event, Ledger, LedgerError, OpKey, OperationRecord};
use crate::shim::{MarkerInfo, MarkerState};

/// What a probe saw of the marker's claim record, for the ledger's contradiction check:
/// `None` when there is no claimed marker to speak of (absent, fenced, or in the instant
/// between a claimer's `mkdir` and its claim record).
pub fn claim_seen(marker: &MarkerInfo) -> Option<ClaimSeen> {
    match marker.state {
        MarkerState::Absent | MarkerState::Fenced => None,
        MarkerState::Running if marker.why.as_deref() == Some("claiming") => None,
        _ => Some(ClaimSeen {
            attempt: marker.attempt.clone().filter(|a| !a.is_empty()),
        }),
    }
}

/// What the report says about a ledger write that failed after dispatch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerWriteError {
    /// `ledger_full` (no space left) or `ledger_write_failed`.
    pub reason_code: &'static str,
    /// The ledger's message (paths and SQLite's words only, never event content).
    pub message: String,
}

/// The run's ledger: strict before dispatch, verdict-preserving after.
#[derive(Debug)]
pub(crate) struct RunLedger<'a> {
    inner: &'a mut Ledger,
    /// Set just before the first request that may reach the host.
    pub dispatched: bool,
    failed: Option<LedgerWriteError>,
}

impl<'a> RunLedger<'a> {
    pub(crate) fn new(inner: &'a mut Ledger) -> Self {
        RunLedger {
            inner,
            dispatched: false,
            failed: None,
        }
    }

    /// Appends one event; after dispatch a failure is kept (see the module doc).
    pub(crate) fn append(
        &mut self,
        key: &OpKey,
        event: &Event,
        durability: Durability,
    ) -> Result<(), LedgerError> {
        if self.failed.is_some() {
            return Ok(());
        }
        match self.inner.append(key, event, durability) {
            Ok(_) => Ok(()),
            Err(e) if self.dispatched => {
                self.failed = Some(LedgerWriteError {
                    reason_code: if e.is_disk_full() {
                        "ledger_full"
                    } else {
                        "ledger_write_failed"
                    },
                    message: e.to_string(),
                });
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Appends events that must be durable before something is sent (an intent, a new
    /// attempt): always strict, and refused once an earlier write of this run failed, so
    /// no attempt ever leaves unrecorded.
    pub(crate) fn append_many(
        &mut self,
        key: &OpKey,
        events: &[Event],
        durability: Durability,
    ) -> Result<Vec<u64>, LedgerError> {
        if let Some(failed) = &self.failed {
            return Err(LedgerError::Invalid {
                message: format!(
                    "the ledger could not record this run ({}); no further attempt is sent",
                    failed.message
                ),
            });
        }
        self.inner.append_many(key, events, durability)
    }

    /// The projection row of one operation.
    pub(crate) fn operation(&self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        self.inner.operation(key)
    }

    /// Every stored event of one operation, oldest first.
    pub(crate) fn events(
        &self,
        key: &OpKey,
    ) -> Result<Vec<crate::ledger::StoredEvent>, LedgerError> {
        self.inner.events(key)
    }

    /// The ledger itself, for reads (the repetition check).
    pub(crate) fn view(&self) -> &Ledger {
        self.inner
    }

    /// The first write that failed after dispatch, if any.
    pub(crate) fn failed(&self) -> Option<&LedgerWriteError> {
        self.failed.as_ref()
    }
}
