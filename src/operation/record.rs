//! The ledger as one `run` writes it, before and after dispatch (docs/ledger.md#writes-before-and-after-dispatch).
//!
//! Before dispatch every failed write is an error: nothing may leave this machine
//! unrecorded. After dispatch the command may be running or done on the host, so a failed
//! write (the ledger's disk filled up) must not cost the caller the verdict: the first
//! failure is kept, every later write of this run is skipped, and the report carries it as
//! `ledger_error`. Skipping keeps the ledger's story honest: it stops at "dispatched",
//! unresolved, and a rerun with the same op id probes the marker and replays from the host.

use serde::Serialize;

use super::commit_group::CommitGroup;
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
    /// A fleet's shared commit: the writes from the first durable one (the intent and the
    /// attempt) up to the dispatch are held, and [`RunLedger::release`] commits them with
    /// other hosts' in one transaction before anything is sent.
    group: Option<&'a CommitGroup>,
    /// The held writes, in order.
    held: Vec<(OpKey, Vec<Event>)>,
}

impl<'a> RunLedger<'a> {
    pub(crate) fn new(inner: &'a mut Ledger, group: Option<&'a CommitGroup>) -> Self {
        RunLedger {
            inner,
            dispatched: false,
            failed: None,
            group,
            held: Vec::new(),
        }
    }

    /// Whether this write is held for the fleet's commit: before dispatch, from the first
    /// durable write on (so that every later one stays behind it, in order).
    fn holds(&self, durability: Durability) -> bool {
        self.group.is_some()
            && !self.dispatched
            && (durability == Durability::Full || !self.held.is_empty())
    }

    /// Makes the held writes durable, in the fleet's shared commit, before dispatch. A
    /// failure is the run's error: nothing is sent.
    pub(crate) async fn release(&mut self) -> Result<(), LedgerError> {
        let held = std::mem::take(&mut self.held);
        match self.group {
            Some(group) if !held.is_empty() => group.commit(held).await,
            _ => Ok(()),
        }
    }

    /// Writes what is held on this run's own handle (`Full`): a read of its own events,
    /// or a run that ends without dispatch, must not lose or miss them.
    fn settle(&mut self) -> Result<(), LedgerError> {
        for (key, events) in std::mem::take(&mut self.held) {
            self.inner.append_many(&key, &events, Durability::Full)?;
        }
        Ok(())
    }

    /// Appends one event; after dispatch a failure is kept (see the module doc).
    pub(crate) fn append(
        &mut self,
        key: &OpKey,
        event: &Event,
        durability: Durability,
    ) -> Result<(), LedgerError> {
        self.append_after_dispatch(key, std::slice::from_ref(event), durability)
    }

    /// Appends events in one commit, all or none; after dispatch a failure is kept, as
    /// for [`RunLedger::append`].
    pub(crate) fn append_after_dispatch(
        &mut self,
        key: &OpKey,
        events: &[Event],
        durability: Durability,
    ) -> Result<(), LedgerError> {
        if self.failed.is_some() {
            return Ok(());
        }
        if self.holds(durability) {
            self.held.push((key.clone(), events.to_vec()));
            return Ok(());
        }
        match self.inner.append_many(key, events, durability) {
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
        if self.holds(durability) {
            self.held.push((key.clone(), events.to_vec()));
            return Ok(Vec::new());
        }
        self.inner.append_many(key, events, durability)
    }

    /// The projection row of one operation.
    pub(crate) fn operation(&self, key: &OpKey) -> Result<Option<OperationRecord>, LedgerError> {
        self.inner.operation(key)
    }

    /// Every stored event of one operation, oldest first (what is held written first).
    pub(crate) fn events(
        &mut self,
        key: &OpKey,
    ) -> Result<Vec<crate::ledger::StoredEvent>, LedgerError> {
        self.settle()?;
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

impl Drop for RunLedger<'_> {
    /// A run that ended before its dispatch (an answer, an interruption, an error after
    /// the attempt was recorded) still records what it held.
    fn drop(&mut self) {
        if let Err(e) = self.settle() {
            tracing::warn!("the ledger could not record this run's last events: {e}");
        }
    }
}
