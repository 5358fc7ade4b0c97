//! How the SQLite ledger stores an event compactly (schema 5, issue 30) without changing
//! what the chain covers: the chain hashes the event's JSON payload text exactly as
//! `serde_json` wrote it, and the store keeps a lossless transcoding of that text.
//!
//! The transcoding is generic over every [`super::Event`] variant (it reads the JSON, not
//! the type), so a new variant needs no storage change:
//! - object keys and other text (routes, host keys, rules, details, words, attempt and
//!   session ids, which repeat within their operation or session) are stored once in
//!   the `atoms` table and referenced by number;
//! - digests (16 or more lowercase hex digits: fingerprints, marker roots, output
//!   digests), unique to their event, are stored inline as packed bytes;
//! - small integers are varints.
//!
//! [`encode`] checks its own work: when decoding its output would not give back the
//! exact input text (a payload not written by `serde_json`, an odd number), it returns
//! `None` and the store keeps the JSON text itself. So a stored event always reads back
//! as the very bytes its hash covers.

use std::fmt::Write as _;

use super::error::LedgerError;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// The SHA-256 of nothing: the digest of every empty stdout and stderr, stored as one byte.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Format version, the first byte of every compact body.
const V1: u8 = 1;

const T_NULL: u8 = 0;
const T_FALSE: u8 = 1;
const T_TRUE: u8 = 2;
const T_INT: u8 = 3;
const T_UINT: u8 = 4;
const T_FLOAT: u8 = 5;
const T_STR: u8 = 6;
const T_ATOM: u8 = 7;
const T_HEX: u8 = 8;
const T_OBJ: u8 = 9;
const T_ARR: u8 = 10;
const T_RAW_ATOM: u8 = 11;
const T_EMPTY_SHA: u8 = 12;

/// Interned text longer than this is stored inline instead (one-off long messages).
const MAX_ATOM: usize = 512;

/// A JSON value that keeps the order of object keys, as read from a payload.
#[derive(Debug, Clone, PartialEq)]
enum J {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = J;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_none<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<J, E> {
                Ok(J::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<J, E> {
                Ok(J::Int(n))
            }
            fn visit_u64<E>(self, n: u64) -> Result<J, E> {
                Ok(i64::try_from(n).map_or(J::Uint(n), J::Int))
            }
            fn visit_f64<E>(self, n: f64) -> Result<J, E> {
                Ok(J::Float(n))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<J, E> {
                Ok(J::Str(s.to_owned()))
            }
            fn visit_string<E>(self, s: String) -> Result<J, E> {
                Ok(J::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(J::Arr(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = a.next_entry::<String, J>()? {
                    v.push((k, x));
                }
                Ok(J::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Where atoms come from and go: the store's `atoms` table (through its cache).
pub(crate) trait Atoms {
    /// The id of `text`, interning it when new.
    fn intern(&mut self, text: &str) -> Result<i64, LedgerError>;
    /// The text of atom `id`.
    fn text(&mut self, id: i64) -> Result<std::rc::Rc<str>, LedgerError>;
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn get_varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        n |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(n);
        }
    }
    None
}

/// `(prefix, hex)` when `s` is a digest: 16 or more lowercase hex digits, an even number
/// (fingerprints, marker roots, output digests: unique, so stored inline, packed). Ids
/// with a word prefix (`at-…`, `s-…`) repeat within their operation or session and are
/// interned like other text. The prefix is kept in the format for later use; it is empty.
fn id_like(s: &str) -> Option<(&str, &str)> {
    let is_hex = |c: u8| c.is_ascii_digit() || (b'a'..=b'f').contains(&c);
    (s.len() >= 16 && s.len().is_multiple_of(2) && s.bytes().all(is_hex)).then_some(("", s))
}

fn has_id_like(v: &J) -> bool {
    match v {
        J::Str(s) => id_like(s).is_some() || s == EMPTY_SHA256,
        J::Arr(a) => a.iter().any(has_id_like),
        J::Obj(o) => o.iter().any(|(_, x)| has_id_like(x)),
        _ => false,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str, atoms: &mut dyn Atoms) -> Result<(), LedgerError> {
    if s == EMPTY_SHA256 {
        out.push(T_EMPTY_SHA);
    } else if let Some((prefix, digits)) = id_like(s) {
        out.push(T_HEX);
        put_varint(out, prefix.len() as u64);
        out.extend_from_slice(prefix.as_bytes());
        let bytes = hex::decode(digits).expect("checked hex");
        put_varint(out, bytes.len() as u64);
        out.extend_from_slice(&bytes);
    } else if s.len() >= 4 && s.len() <= MAX_ATOM {
        out.push(T_ATOM);
        put_varint(out, atoms.intern(s)? as u64);
    } else {
        out.push(T_STR);
        put_varint(out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
    Ok(())
}

fn put(out: &mut Vec<u8>, v: &J, depth: usize, atoms: &mut dyn Atoms) -> Result<(), LedgerError> {
    match v {
        J::Null => out.push(T_NULL),
        J::Bool(false) => out.push(T_FALSE),
        J::Bool(true) => out.push(T_TRUE),
        J::Int(n) => {
            out.push(T_INT);
            put_varint(out, ((n << 1) ^ (n >> 63)) as u64);
        }
        J::Uint(n) => {
            out.push(T_UINT);
            put_varint(out, *n);
        }
        J::Float(f) => {
            out.push(T_FLOAT);
            out.extend_from_slice(&f.to_le_bytes());
        }
        J::Str(s) => put_str(out, s, atoms)?,
        // A nested value with nothing unique in it (a route, a list of paths) repeats
        // across operations: stored once as its JSON text.
        J::Arr(_) | J::Obj(_)
            if depth > 0 && !has_id_like(v) && {
                let text = to_json(v);
                text.len() >= 4 && text.len() <= MAX_ATOM
            } =>
        {
            out.push(T_RAW_ATOM);
            put_varint(out, atoms.intern(&to_json(v))? as u64);
        }
        J::Arr(a) => {
            out.push(T_ARR);
            put_varint(out, a.len() as u64);
            for x in a {
                put(out, x, depth + 1, atoms)?;
            }
        }
        J::Obj(o) => {
            out.push(T_OBJ);
            put_varint(out, o.len() as u64);
            for (k, x) in o {
                put_varint(out, atoms.intern(k)? as u64);
                put(out, x, depth + 1, atoms)?;
            }
        }
    }
    Ok(())
}

fn to_json(v: &J) -> String {
    let mut s = String::new();
    write_json(&mut s, v);
    s
}

/// `s` as a JSON string, byte for byte as `serde_json` writes it: it escapes only `"`,
/// `\\` and control characters, so text without them is copied as it is (the common
/// case, and the walk of `audit verify` decodes every string of every event).
fn write_str(out: &mut String, s: &str) {
    if s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push_str(&serde_json::to_string(s).expect("strings serialize"));
    } else {
        out.reserve(s.len() + 2);
        out.push('"');
        out.push_str(s);
        out.push('"');
    }
}

fn write_json(out: &mut String, v: &J) {
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Int(n) => {
            let _ = write!(out, "{n}");
        }
        J::Uint(n) => {
            let _ = write!(out, "{n}");
        }
        J::Float(f) => out.push_str(&serde_json::to_string(f).unwrap_or_default()),
        J::Str(s) => write_str(out, s),
        J::Arr(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(out, x);
            }
            out.push(']');
        }
        J::Obj(o) => {
            out.push('{');
            for (i, (k, x)) in o.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(out, k);
                out.push(':');
                write_json(out, x);
            }
            out.push('}');
        }
    }
}

/// The compact body of `payload`, or `None` when it would not read back byte for byte
/// (then the store keeps the text).
pub(crate) fn encode(payload: &str, atoms: &mut dyn Atoms) -> Result<Option<Vec<u8>>, LedgerError> {
    let Ok(value) = serde_json::from_str::<J>(payload) else {
        return Ok(None);
    };
    if to_json(&value) != payload {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(payload.len() / 3);
    out.push(V1);
    put(&mut out, &value, 0, atoms)?;
    Ok(Some(out))
}

/// What went wrong decoding a body (no content).
pub(crate) type Bad = &'static str;

/// The JSON payload text of a compact body, and the value of its top-level `kind` key
/// when it is the first key (as serde writes its tag).
pub(crate) fn decode(
    body: &[u8],
    atoms: &mut dyn Atoms,
) -> Result<Result<(String, Option<String>), Bad>, LedgerError> {
    let mut out = String::with_capacity(body.len() * 3);
    let mut kind = String::new();
    Ok(decode_into(body, atoms, &mut out, &mut kind)?.map(|found| (out, found.then_some(kind))))
}

/// The value of a compact body's top-level `kind` key when it is the first key (what
/// [`decode`] gives as the kind), read without decoding the rest: a window's counts need
/// every event's kind and few events' payloads. None: no such key, or not a body opmark
/// wrote (a full decode names that).
pub(crate) fn first_kind(
    body: &[u8],
    atoms: &mut dyn Atoms,
) -> Result<Option<String>, LedgerError> {
    let mut i = 1;
    if body.first() != Some(&V1) || body.get(i) != Some(&T_OBJ) {
        return Ok(None);
    }
    i += 1;
    if get_varint(body, &mut i).is_none_or(|n| n == 0) {
        return Ok(None);
    }
    let Some(key) = get_varint(body, &mut i) else {
        return Ok(None);
    };
    if &*atoms.text(key as i64)? != "kind" {
        return Ok(None);
    }
    let mut value = String::new();
    if get(body, &mut i, &mut value, atoms, None)?.is_err() {
        return Ok(None);
    }
    Ok(serde_json::from_str::<String>(&value).ok())
}

/// [`decode`] into buffers the caller reuses (`audit verify --full` decodes every event,
/// and a fresh text per event was a tenth of its time in the allocator): the payload
/// text into `out`, the `kind` into `kind` (true: there is one). Both are cleared first.
pub(crate) fn decode_into(
    body: &[u8],
    atoms: &mut dyn Atoms,
    out: &mut String,
    kind: &mut String,
) -> Result<Result<bool, Bad>, LedgerError> {
    out.clear();
    kind.clear();
    if body.first() != Some(&V1) {
        return Ok(Err("unknown body format"));
    }
    out.reserve(body.len() * 3);
    let mut i = 1;
    let mut found = None;
    match get(body, &mut i, out, atoms, Some(&mut found))? {
        Ok(()) if i == body.len() => {}
        Ok(()) => return Ok(Err("trailing bytes")),
        Err(e) => return Ok(Err(e)),
    }
    let Some(range) = found else {
        return Ok(Ok(false));
    };
    let text = &out[range];
    match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        // A tag as serde writes it: no escapes, so the text between the quotes is it.
        Some(plain) if !plain.contains('\\') => kind.push_str(plain),
        _ => match serde_json::from_str::<String>(text) {
            Ok(k) => kind.push_str(&k),
            Err(_) => return Ok(Ok(false)),
        },
    }
    Ok(Ok(true))
}

fn get(
    b: &[u8],
    i: &mut usize,
    out: &mut String,
    atoms: &mut dyn Atoms,
    kind: Option<&mut Option<std::ops::Range<usize>>>,
) -> Result<Result<(), Bad>, LedgerError> {
    macro_rules! need {
        ($e:expr) => {
            match $e {
                Some(x) => x,
                None => return Ok(Err("truncated body")),
            }
        };
    }
    let tag = need!(b.get(*i).copied());
    *i += 1;
    match tag {
        T_NULL => out.push_str("null"),
        T_FALSE => out.push_str("false"),
        T_TRUE => out.push_str("true"),
        T_INT => {
            let z = need!(get_varint(b, i));
            let n = ((z >> 1) as i64) ^ -((z & 1) as i64);
            let _ = write!(out, "{n}");
        }
        T_UINT => {
            let _ = write!(out, "{}", need!(get_varint(b, i)));
        }
        T_FLOAT => {
            let bytes: [u8; 8] = need!(b.get(*i..*i + 8)).try_into().expect("8 bytes");
            *i += 8;
            out.push_str(&serde_json::to_string(&f64::from_le_bytes(bytes)).unwrap_or_default());
        }
        T_STR => {
            let n = need!(get_varint(b, i)) as usize;
            let s = need!(b.get(*i..i.saturating_add(n)));
            *i += n;
            let Ok(s) = std::str::from_utf8(s) else {
                return Ok(Err("text is not UTF-8"));
            };
            write_str(out, s);
        }
        T_ATOM => {
            let id = need!(get_varint(b, i));
            write_str(out, &atoms.text(id as i64)?);
        }
        T_RAW_ATOM => {
            let id = need!(get_varint(b, i));
            out.push_str(&atoms.text(id as i64)?);
        }
        T_EMPTY_SHA => write_str(out, EMPTY_SHA256),
        T_HEX => {
            let n = need!(get_varint(b, i)) as usize;
            let prefix = need!(b.get(*i..i.saturating_add(n)));
            *i += n;
            let Ok(prefix) = std::str::from_utf8(prefix) else {
                return Ok(Err("text is not UTF-8"));
            };
            let n = need!(get_varint(b, i)) as usize;
            let bytes = need!(b.get(*i..i.saturating_add(n)));
            *i += n;
            // The prefix quoted (and escaped) as text, then the digits inside the quotes:
            // hex digits need no escape.
            write_str(out, prefix);
            out.pop();
            super::chain::push_hex(bytes, out);
            out.push('"');
        }
        T_ARR => {
            let n = need!(get_varint(b, i));
            out.push('[');
            for k in 0..n {
                if k > 0 {
                    out.push(',');
                }
                if let Err(e) = get(b, i, out, atoms, None)? {
                    return Ok(Err(e));
                }
            }
            out.push(']');
        }
        T_OBJ => {
            let n = need!(get_varint(b, i));
            let mut kind = kind;
            out.push('{');
            for k in 0..n {
                if k > 0 {
                    out.push(',');
                }
                let key = atoms.text(need!(get_varint(b, i)) as i64)?;
                write_str(out, &key);
                out.push(':');
                let start = out.len();
                if let Err(e) = get(b, i, out, atoms, None)? {
                    return Ok(Err(e));
                }
                if let (0, "kind", Some(kind)) = (k, &*key, kind.as_deref_mut()) {
                    *kind = Some(start..out.len());
                }
            }
            out.push('}');
        }
        _ => return Ok(Err("unknown value tag")),
    }
    Ok(Ok(()))
}

/// An event time as stored: micros since the epoch when `at` is exactly the stamp opmark
/// writes (`YYYY-MM-DDTHH:MM:SS.ffffffZ`) of that instant, else `None` (keep the text).
pub(crate) fn at_to_micros(at: &str) -> Option<i64> {
    let parsed = time::PrimitiveDateTime::parse(at, STAMP).ok()?.assume_utc();
    let micros = i64::try_from(parsed.unix_timestamp_nanos() / 1000).ok()?;
    (micros_to_at(micros).as_deref() == Some(at)).then_some(micros)
}

/// The stamp text of `micros` since the epoch. Years 0 to 9999 are written here (every
/// event time is one, and `audit verify` formats each); others by `time`, whose text
/// this matches byte for byte (a unit test compares them).
pub(crate) fn micros_to_at(micros: i64) -> Option<String> {
    let mut at = String::new();
    push_at(micros, &mut at).then_some(at)
}

/// [`micros_to_at`] appended to `out` (false: no such instant, nothing appended).
pub(crate) fn push_at(micros: i64, out: &mut String) -> bool {
    match stamp_bytes(micros) {
        Some(b) => {
            out.push_str(std::str::from_utf8(&b).expect("digits and ASCII punctuation"));
            true
        }
        None => match micros_to_at_by_time(micros) {
            Some(t) => {
                out.push_str(&t);
                true
            }
            None => false,
        },
    }
}

/// The stamp's bytes for years 0 to 9999, without an allocation.
fn stamp_bytes(micros: i64) -> Option<[u8; 27]> {
    let (secs, frac) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    if !(0..=9999).contains(&year) {
        return None;
    }
    let mut b = *b"0000-00-00T00:00:00.000000Z";
    let mut put = |at: usize, width: usize, mut n: i64| {
        for k in (at..at + width).rev() {
            b[k] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, day_secs / 3600);
    put(14, 2, day_secs / 60 % 60);
    put(17, 2, day_secs % 60);
    put(20, 6, frac);
    Some(b)
}

fn micros_to_at_by_time(micros: i64) -> Option<String> {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
        .ok()?
        .format(STAMP)
        .ok()
}

/// The proleptic Gregorian (year, month, day) of `days` after 1970-01-01 (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// A lower or upper bound on such a column, for a stamp opmark computed
/// (`stamp_before`): its micros (SQLite stores them so, see
/// `store::sqlite::operations`). An empty or out-of-range bound (`stamp_before` found
/// no date) is the earliest micros, so it bounds nothing; stored texts sort after every
/// integer, as SQLite orders them.
pub(crate) fn stamp_bound(at: &str) -> i64 {
    at_to_micros(at).unwrap_or(i64::MIN)
}

const STAMP: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::rc::Rc;

    #[derive(Default)]
    struct Mem(HashMap<String, i64>, Vec<Rc<str>>);
    impl Atoms for Mem {
        fn intern(&mut self, text: &str) -> Result<i64, crate::ledger::LedgerError> {
            if let Some(id) = self.0.get(text) {
                return Ok(*id);
            }
            self.1.push(text.into());
            self.0.insert(text.to_owned(), self.1.len() as i64);
            Ok(self.1.len() as i64)
        }
        fn text(&mut self, id: i64) -> Result<Rc<str>, crate::ledger::LedgerError> {
            Ok(self.1[id as usize - 1].clone())
        }
    }

    #[test]
    fn every_payload_reads_back_byte_for_byte() {
        let mut atoms = Mem::default();
        for payload in [
            r#"{"kind":"connected","attempt_id":"at-0123456789abcdef","route":{"alias":"t1","port":22,"identities":["/a/b"],"jump":null},"host_key":"SHA256:x"}"#,
            r#"{"kind":"exit_received","exit_code":-1,"n":18446744073709551615,"f":1.5,"s":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855","t":"café \"q\"\n\u0001","e":""}"#,
            r#"{"kind":"x","nested":{"id":"s-00000000000000ff","list":[1,[2,{}]]}}"#,
        ] {
            let body = encode(payload, &mut atoms).unwrap().expect("compact");
            assert!(body.len() < payload.len());
            let (text, kind) = decode(&body, &mut atoms).unwrap().unwrap();
            assert_eq!(text, payload);
            assert_eq!(
                kind.as_deref(),
                Some(&payload[9..payload[9..].find('"').unwrap() + 9])
            );
        }
    }

    #[test]
    fn decoding_into_reused_buffers_keeps_nothing_of_the_event_before() {
        let mut atoms = Mem::default();
        let (mut out, mut kind) = (String::new(), String::new());
        for (payload, want_kind) in [
            (
                r#"{"kind":"connected","q":"q\"x","digest":"0123456789abcdef0123456789abcdef","n":3}"#,
                Some("connected"),
            ),
            (r#"{"kind":"a\"b","s":"t"}"#, Some("a\"b")),
            (r#"{"kind":7}"#, None),
            (r#"{"x":1,"kind":"late"}"#, None),
            (r#"{"kind":"x"}"#, Some("x")),
        ] {
            let body = encode(payload, &mut atoms).unwrap().expect("compact");
            let found = decode_into(&body, &mut atoms, &mut out, &mut kind)
                .unwrap()
                .unwrap();
            assert_eq!(out, payload);
            assert_eq!(found.then_some(kind.as_str()), want_kind, "{payload}");
            let fresh = decode(&body, &mut atoms).unwrap().unwrap();
            assert_eq!((fresh.0.as_str(), fresh.1.as_deref()), (payload, want_kind));
        }
        // A hex value's prefix is escaped as text is; its digits follow inside the quotes.
        let prefixed = [V1, T_HEX, 3, b'q', b'"', b'-', 2, 0xab, 0xcd];
        assert_eq!(
            decode_into(&prefixed, &mut atoms, &mut out, &mut kind).unwrap(),
            Ok(false)
        );
        assert_eq!(out, r#""q\"-abcd""#);
        let body = encode(r#"{"kind":"x","n":[1,2]}"#, &mut atoms)
            .unwrap()
            .unwrap();
        let truncated = &body[..body.len() - 1];
        assert_eq!(
            decode_into(truncated, &mut atoms, &mut out, &mut kind).unwrap(),
            Err("truncated body")
        );
    }

    #[test]
    fn the_kind_alone_is_the_kind_a_full_decode_gives() {
        let mut atoms = Mem::default();
        for payload in [
            r#"{"kind":"verdict","verdict":"completed"}"#,
            r#"{"kind":"a\"b","s":"t"}"#,
            r#"{"kind":7}"#,
            r#"{"x":1,"kind":"late"}"#,
            r#"{}"#,
            r#"[1]"#,
        ] {
            let body = encode(payload, &mut atoms).unwrap().expect("compact");
            let full = decode(&body, &mut atoms).unwrap().unwrap().1;
            assert_eq!(first_kind(&body, &mut atoms).unwrap(), full, "{payload}");
        }
        assert_eq!(first_kind(&[V1, T_OBJ, 1], &mut atoms).unwrap(), None);
        assert_eq!(first_kind(&[9], &mut atoms).unwrap(), None);
    }

    #[test]
    fn a_stamp_appended_is_the_stamp_made() {
        let mut out = String::from("kept:");
        for m in [0, 1_764_000_000_123_456, -62_167_219_200_000_001, i64::MAX] {
            out.truncate(5);
            let made = micros_to_at(m);
            assert_eq!(push_at(m, &mut out), made.is_some(), "{m}");
            assert_eq!(out, format!("kept:{}", made.unwrap_or_default()));
        }
    }

    #[test]
    fn text_that_would_not_read_back_is_kept_as_text() {
        let mut atoms = Mem::default();
        for payload in [
            r#"{"kind": "spaced"}"#,
            r#"{"kind":"x","n":1e3}"#,
            r#"{"kind":"x","e":"\u0041"}"#,
            "not json",
        ] {
            assert_eq!(encode(payload, &mut atoms).unwrap(), None, "{payload}");
        }
    }

    #[test]
    fn stamps_round_trip_or_stay_text() {
        let at = "2026-12-01T17:25:10.123456Z";
        assert_eq!(micros_to_at(at_to_micros(at).unwrap()).unwrap(), at);
        assert_eq!(at_to_micros("2026-12-01T17:25:10Z"), None);
        assert_eq!(at_to_micros("2026-12-01 17:25:10.123456Z"), None);
    }

    #[test]
    fn stamps_are_formatted_as_time_formats_them() {
        let mut values: Vec<i64> = vec![
            0,
            -1,
            1,
            951_782_400_000_000,     // 2000-02-29
            4_107_542_399_999_999,   // 2100-02-28T23:59:59.999999
            253_402_300_799_999_999, // 9999-12-31T23:59:59.999999
            -62_167_219_200_000_000, // 0000-01-01
            -62_167_219_200_000_001, // the microsecond before: by `time`
            253_402_300_800_000_000, // 10000-01-01: out of `time`'s range
            i64::MIN,
            i64::MAX,
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push((x % 320_000_000_000_000_000) as i64 - 62_200_000_000_000_000);
        }
        for m in values {
            assert_eq!(micros_to_at(m), micros_to_at_by_time(m), "{m}");
        }
    }

    #[test]
    fn json_strings_are_written_as_serde_json_writes_them() {
        for s in [
            "",
            "plain",
            "a \"quote\"",
            "back\\slash",
            "tab\tnew\nline",
            "\u{1}\u{1f}\u{7f}",
            "é ☃ 🦀",
        ] {
            let mut out = String::new();
            write_str(&mut out, s);
            assert_eq!(out, serde_json::to_string(s).unwrap(), "{s:?}");
        }
    }
}
