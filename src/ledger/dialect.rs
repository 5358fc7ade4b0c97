//! How a backend's SQL spells what `stats` and the health counts read beyond plain SQL.
//! Its own module: the counts ([`super::stats`], [`super::health`]) are written once over
//! it, and each backend only fills one in.

/// How a backend's SQL spells what `stats` reads beyond plain SQL: a JSON field of an
/// event's payload, and a true boolean column.
pub(crate) struct StatsDialect {
    /// The `verdict` field of `payload`, as text.
    pub verdict: &'static str,
    /// The `number` field of `e.payload`, as an integer.
    pub attempt_number: &'static str,
    /// `operations.unresolved` is true.
    pub unresolved: &'static str,
    /// The placeholder of the window's first sequence number.
    pub param: &'static str,
    /// A text field of a JSON column: `(column, field)` to SQL.
    pub json_text: fn(&str, &str) -> String,
    /// `(a, b)`: the fingerprints `a` and `b` are equal, spelled so the backend's intent
    /// index serves it.
    pub same_fingerprint: fn(&str, &str) -> String,
    /// A stamp opmark formatted as a literal to compare `created_at`/`updated_at` with.
    pub stamp: fn(&str) -> String,
}
