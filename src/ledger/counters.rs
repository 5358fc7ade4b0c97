//! The named counters `stats` reads, and where an event's counts are added: an append's
//! changes ([`Counts`]) or `audit verify --full`'s running recount. A leaf of its own: the
//! append, the health counts and the verify all add to it.

use std::collections::BTreeMap;

/// Changes to the `counters` table, by counter name (see `append::count`).
pub(crate) type Counts = BTreeMap<String, i64>;

/// Where `append::count` adds: an append's changes to the counters ([`Counts`]), or the
/// running recount of `audit verify --full`, which adds to it for every event of the
/// history (a hash map there: a name looked up in a tree compared texts several times).
pub(crate) trait Counters {
    /// The counter `name`, when it has been added to.
    fn counter(&mut self, name: &str) -> Option<&mut i64>;
    /// Starts the counter `name` at `n`.
    fn start(&mut self, name: String, n: i64);

    /// Adds `n` to the counter `name` (its name is copied only the first time).
    fn add(&mut self, name: &str, n: i64) {
        match self.counter(name) {
            Some(v) => *v += n,
            None => self.start(name.to_owned(), n),
        }
    }
}

impl Counters for Counts {
    fn counter(&mut self, name: &str) -> Option<&mut i64> {
        self.get_mut(name)
    }
    fn start(&mut self, name: String, n: i64) {
        self.insert(name, n);
    }
}
