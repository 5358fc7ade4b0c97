//! How many tool calls are running now: what the server's shutdown waits for and what
//! `tasks` counts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts a tool thread as busy from creation until it ends, however it ends.
pub(super) struct Busy(Arc<AtomicUsize>);

impl Busy {
    pub(super) fn new(count: &Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::SeqCst);
        Busy(Arc::clone(count))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
