//! The atoms of a SQLite ledger: the texts (op ids, hosts, repeated payload strings) a
//! compact event row names by id, and the [`codec::Atoms`] views over a connection that
//! intern and read them, cached for the life of the connection.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

use crate::ledger::codec;
use crate::ledger::error::LedgerError;

/// The atoms of one SQLite ledger known to be committed, by id and by text. Atoms are
/// never changed or removed once committed, so the cache stays right for the life of the
/// connection. Hashed with foldhash, not SipHash: `audit verify --full` looks up
/// several atoms per event.
#[derive(Debug, Default)]
pub(crate) struct AtomCache {
    by_id: HashMap<i64, Rc<str>, foldhash::fast::RandomState>,
    by_text: HashMap<Rc<str>, i64, foldhash::fast::RandomState>,
}

impl AtomCache {
    /// The write transaction that interned or read `pending` committed.
    pub(crate) fn committed(&mut self, pending: Vec<(i64, Rc<str>)>) {
        for (id, text) in pending {
            self.remember(id, text);
        }
    }

    fn remember(&mut self, id: i64, text: Rc<str>) {
        self.by_text.insert(text.clone(), id);
        self.by_id.insert(id, text);
    }
}

fn atom_digest(text: &str) -> i64 {
    let d = Sha256::digest(text.as_bytes());
    i64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
}

/// [`codec::Atoms`] over a connection: committed atoms from (and into) the cache; atoms
/// interned or read inside an open write transaction stay `pending` until it commits.
pub(crate) struct AtomsOf<'a> {
    conn: &'a Connection,
    cache: &'a RefCell<AtomCache>,
    /// Inside a write transaction: what it interned or read, for [`AtomsOf::commit`].
    pending: Option<Vec<(i64, Rc<str>)>>,
}

impl<'a> AtomsOf<'a> {
    /// For reading committed data (outside a write transaction).
    pub(crate) fn reading(conn: &'a Connection, cache: &'a RefCell<AtomCache>) -> Self {
        AtomsOf {
            conn,
            cache,
            pending: None,
        }
    }

    /// For a write transaction: call [`AtomsOf::commit`] once it committed.
    pub(crate) fn writing(conn: &'a Connection, cache: &'a RefCell<AtomCache>) -> Self {
        AtomsOf {
            conn,
            cache,
            pending: Some(Vec::new()),
        }
    }

    /// What the write transaction interned or read: committed ones once it commits
    /// ([`AtomCache::committed`]).
    pub(crate) fn into_pending(self) -> Vec<(i64, Rc<str>)> {
        self.pending.unwrap_or_default()
    }
}

impl codec::Atoms for AtomsOf<'_> {
    fn intern(&mut self, text: &str) -> Result<i64, LedgerError> {
        if let Some(id) = self.cache.borrow().by_text.get(text) {
            return Ok(*id);
        }
        if let Some((id, _)) = self.pending.iter().flatten().find(|(_, t)| &**t == text) {
            return Ok(*id);
        }
        let digest = atom_digest(text);
        let found: Option<i64> = self
            .conn
            .prepare_cached("SELECT id FROM atoms WHERE digest = ?1 AND text = ?2")?
            .query_row(params![digest, text], |r| r.get(0))
            .optional()?;
        let id = match found {
            Some(id) => id,
            None => {
                self.conn
                    .prepare_cached("INSERT INTO atoms (digest, text) VALUES (?1, ?2)")?
                    .execute(params![digest, text])?;
                self.conn.last_insert_rowid()
            }
        };
        match &mut self.pending {
            Some(p) => p.push((id, text.into())),
            None => self.cache.borrow_mut().remember(id, text.into()),
        }
        Ok(id)
    }

    fn text(&mut self, id: i64) -> Result<Rc<str>, LedgerError> {
        if let Some(t) = self.cache.borrow().by_id.get(&id) {
            return Ok(t.clone());
        }
        if let Some((_, t)) = self.pending.iter().flatten().find(|(i, _)| *i == id) {
            return Ok(t.clone());
        }
        let text: Option<String> = self
            .conn
            .prepare_cached("SELECT text FROM atoms WHERE id = ?1")?
            .query_row(params![id], |r| r.get(0))
            .optional()?;
        // A missing atom makes the event undecodable (its hash then fails), not an error.
        let text: Rc<str> = text
            .unwrap_or_else(|| "\u{0}missing atom".to_owned())
            .into();
        match &mut self.pending {
            Some(p) => p.push((id, text.clone())),
            None => self.cache.borrow_mut().remember(id, text.clone()),
        }
        Ok(text)
    }
}

/// The atoms `audit verify --full` decodes with: the `atoms` table read once, in id order,
/// as far as the events need, in the walk's own snapshot. An atom is made when an event
/// first uses it, so an event names only atoms at or below the highest id made before it,
/// and reading ahead to an id turns what was a query per atom first seen (an operation
/// makes about one, its attempt id) into one scan. Held until the walk ends, as the cache
/// held them before; `intern` is refused (a walk only reads).
pub(crate) struct AtomsInOrder<'s> {
    rows: rusqlite::Rows<'s>,
    /// By id, for ids that come nearly dense (every id opmark makes: a rowid).
    dense: Vec<Option<Rc<str>>>,
    /// Ids far past the dense run (or below 0): possible only in an edited table.
    sparse: HashMap<i64, Rc<str>, foldhash::fast::RandomState>,
    /// The highest id read so far, and whether the table has been read to its end.
    read_to: i64,
    done: bool,
    missing: Rc<str>,
}

/// How far past the dense run an atom's id may be and still extend it.
const DENSE_GAP: i64 = 4096;

impl<'s> AtomsInOrder<'s> {
    /// `stmt` is [`ATOMS_IN_ORDER`] prepared on the walk's transaction.
    pub(crate) fn new(stmt: &'s mut rusqlite::Statement<'_>) -> Result<Self, LedgerError> {
        Ok(AtomsInOrder {
            rows: stmt.query([])?,
            dense: Vec::new(),
            sparse: HashMap::default(),
            read_to: i64::MIN,
            done: false,
            missing: "\u{0}missing atom".into(),
        })
    }

    fn read_through(&mut self, id: i64) -> Result<(), LedgerError> {
        while !self.done && self.read_to < id {
            let Some(r) = self.rows.next()? else {
                self.done = true;
                break;
            };
            let (at, text): (i64, String) = (r.get(0)?, r.get(1)?);
            self.read_to = at;
            let len = self.dense.len() as i64;
            if (0..len + DENSE_GAP).contains(&at) {
                if at >= len {
                    self.dense.resize(at as usize + 1, None);
                }
                self.dense[at as usize] = Some(text.into());
            } else {
                self.sparse.insert(at, text.into());
            }
        }
        Ok(())
    }
}

/// The query [`AtomsInOrder`] reads.
pub(crate) const ATOMS_IN_ORDER: &str = "SELECT id, text FROM atoms ORDER BY id";

impl codec::Atoms for AtomsInOrder<'_> {
    fn intern(&mut self, _text: &str) -> Result<i64, LedgerError> {
        Err(LedgerError::Invalid {
            message: "internal error: the verify walk tried to add an atom; it only reads"
                .to_owned(),
        })
    }

    fn text(&mut self, id: i64) -> Result<Rc<str>, LedgerError> {
        self.read_through(id)?;
        let found = match usize::try_from(id) {
            Ok(i) if i < self.dense.len() => self.dense[i].as_ref(),
            _ => self.sparse.get(&id),
        };
        // A missing atom makes the event undecodable (its hash then fails), not an error.
        Ok(found.unwrap_or(&self.missing).clone())
    }
}
