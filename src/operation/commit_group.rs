//! The fleet's shared commit: the writes each host must have on disk before its dispatch,
//! committed for every host that reached its dispatch meanwhile in one transaction.

use std::cell::RefCell;

use tokio::sync::{oneshot, Notify};

use crate::ledger::{Durability, Event, Ledger, LedgerError, OpKey};

/// One host's held writes and where its answer goes.
type Waiting = (
    Vec<(OpKey, Vec<Event>)>,
    oneshot::Sender<Result<(), LedgerError>>,
);

/// The fleet's shared commit of the writes before dispatch: hosts hand theirs in
/// ([`CommitGroup::commit`]) and wait; [`CommitGroup::serve`], a task of the same thread,
/// commits everything handed in since its last commit in one transaction.
pub struct CommitGroup {
    /// The handle the shared commits go through.
    ledger: RefCell<Ledger>,
    /// The hosts waiting for the next commit.
    waiting: RefCell<Vec<Waiting>>,
    /// Told when a host hands its writes in.
    wake: Notify,
    /// Commits made, and hosts they recorded (for the tests: one commit per host would
    /// be no batching).
    made: std::cell::Cell<(usize, usize)>,
}

impl std::fmt::Debug for CommitGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommitGroup")
            .field("commits_and_hosts", &self.made.get())
            .finish_non_exhaustive()
    }
}

impl CommitGroup {
    pub(super) fn new(ledger: Ledger) -> CommitGroup {
        CommitGroup {
            ledger: RefCell::new(ledger),
            waiting: RefCell::default(),
            wake: Notify::new(),
            made: Default::default(),
        }
    }

    /// Hands one host's writes in and waits until they are committed (durably) or failed.
    pub(crate) async fn commit(&self, writes: Vec<(OpKey, Vec<Event>)>) -> Result<(), LedgerError> {
        let (tx, rx) = oneshot::channel();
        self.waiting.borrow_mut().push((writes, tx));
        self.wake.notify_one();
        rx.await.unwrap_or_else(|_| {
            Err(LedgerError::Invalid {
                message: "the fleet's shared commit ended before this host's writes were recorded"
                    .into(),
            })
        })
    }

    /// Commits what hosts hand in, for as long as the fleet runs. It waits one turn of the
    /// thread after a host hands its writes in, so that every host ready to dispatch joins
    /// the same commit. When a shared commit fails, each host's writes are tried alone, so
    /// that one host's bad write (a conflicting intent) costs only that host.
    pub(super) async fn serve(&self) {
        loop {
            self.wake.notified().await;
            tokio::task::yield_now().await;
            let batch = std::mem::take(&mut *self.waiting.borrow_mut());
            if batch.is_empty() {
                continue;
            }
            let ops: Vec<(OpKey, Vec<Event>)> = batch
                .iter()
                .flat_map(|(writes, _)| writes.iter().cloned())
                .collect();
            let mut ledger = self.ledger.borrow_mut();
            let (commits, hosts) = self.made.get();
            match ledger.append_batch_durable(&ops, Durability::Full) {
                Ok(()) => {
                    self.made.set((commits + 1, hosts + batch.len()));
                    for (_, answer) in batch {
                        let _ = answer.send(Ok(()));
                    }
                }
                Err(e) if batch.len() == 1 => {
                    let _ = batch
                        .into_iter()
                        .next()
                        .map(|(_, answer)| answer.send(Err(e)));
                }
                Err(_) => {
                    self.made.set((commits + batch.len(), hosts + batch.len()));
                    for (writes, answer) in batch {
                        let alone = writes.iter().try_for_each(|(key, events)| {
                            ledger.append_many(key, events, Durability::Full).map(drop)
                        });
                        let _ = answer.send(alone);
                    }
                }
            }
        }
    }
}
