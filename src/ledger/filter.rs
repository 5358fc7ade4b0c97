//! Which operations `list` returns ([`ListFilter`]), and the one query both backends
//! build from it ([`ListFilter::sql`], each with its own placeholders and bound values).

/// Which operations `list` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only unresolved operations.
    pub unresolved: bool,
    /// Only operations with at least one contradiction.
    pub contradicted: bool,
    /// Only this host.
    pub host: Option<String>,
    /// Only operations whose last event is at or after this sequence number (see
    /// [`Ledger::seq_since`](super::Ledger::seq_since)).
    pub since_seq: Option<u64>,
    /// Only operations whose projected `updated_at` is at or after this stamp (checked on
    /// the rows `since_seq` selects, so still O(window)).
    pub since_at: Option<String>,
    /// Only operations whose last event is before this sequence number: the next page
    /// after a page whose oldest row had this `last_seq`.
    pub before_seq: Option<u64>,
    /// At most this many.
    pub limit: Option<usize>,
}

/// A bound value of a query built by [`ListFilter::sql`].
#[derive(Debug, Clone)]
pub(crate) enum SqlArg {
    Text(String),
    Int(i64),
    /// A stamp opmark formatted, compared with `created_at`/`updated_at` (SQLite stores
    /// those as micros).
    Stamp(String),
}

impl ListFilter {
    /// The query (with `placeholder(i)` for the i-th bound value, from 1) and its values.
    /// Plain conditions, no `(? = 0 OR …)` forms: those hide from the planner which index
    /// fits, and it then scans every operation.
    pub(crate) fn sql(
        &self,
        columns: &str,
        unresolved: &str,
        placeholder: impl Fn(usize) -> String,
    ) -> (String, Vec<SqlArg>) {
        let mut conds: Vec<String> = Vec::new();
        let mut args = Vec::new();
        let mut bind = |conds: &mut Vec<String>, cond: &str, arg: SqlArg| {
            args.push(arg);
            conds.push(cond.replace('?', &placeholder(args.len())));
        };
        if self.unresolved {
            // The literal the partial index `operations_unresolved` is made on.
            conds.push(unresolved.to_owned());
        }
        if self.contradicted {
            conds.push("contradictions > 0".to_owned());
        }
        if let Some(host) = &self.host {
            bind(&mut conds, "host = ?", SqlArg::Text(host.clone()));
        }
        if let Some(seq) = self.since_seq {
            bind(&mut conds, "last_seq >= ?", SqlArg::Int(seq as i64));
        }
        if let Some(at) = &self.since_at {
            bind(&mut conds, "updated_at >= ?", SqlArg::Stamp(at.clone()));
        }
        if let Some(seq) = self.before_seq {
            bind(&mut conds, "last_seq < ?", SqlArg::Int(seq as i64));
        }
        let mut sql = format!("SELECT {columns} FROM operations");
        if !conds.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conds.join(" AND "));
        }
        sql.push_str(" ORDER BY last_seq DESC");
        if let Some(limit) = self.limit {
            sql.push_str(&format!(" LIMIT {limit}"));
        }
        (sql, args)
    }
}
