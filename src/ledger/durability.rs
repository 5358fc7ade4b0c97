//! How hard a commit is pushed to disk, chosen per append.

/// How hard a commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: the WAL is fsynced before commit returns (survives power loss).
    /// For the intent and the attempt, which must be durable before dispatch.
    Full,
    /// `synchronous=NORMAL`: survives any process crash, may lose the newest commits on
    /// power loss.
    Normal,
}
