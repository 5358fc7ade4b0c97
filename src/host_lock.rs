//! Host locks (docs/host-protocol.md#host-locks): `run --lock NAME[:N]` names
//! a semaphore of capacity N (default 1) in the host's marker root that the command holds
//! while it runs. Here the name as the caller writes it, checked once at the edge (CLI or
//! MCP), and the list as the shim receives it.

use std::fmt;

/// The largest capacity a lock may have: a slot is a file on the host, and a lock of more
/// slots than this is no lock.
pub const MAX_CAPACITY: u32 = 999;

/// The longest lock name (a directory name in the marker root).
pub const MAX_NAME: usize = 64;

/// One `--lock NAME[:N]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostLock {
    name: String,
    capacity: u32,
}

impl HostLock {
    /// Reads `NAME` or `NAME:N`: a name of `[A-Za-z0-9._-]` starting with a letter or
    /// digit, at most [`MAX_NAME`] long; N from 1 to [`MAX_CAPACITY`].
    pub fn parse(text: &str) -> Result<HostLock, String> {
        let (name, capacity) = match text.rsplit_once(':') {
            Some((name, n)) => {
                let capacity = n
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_CAPACITY).contains(n));
                match capacity {
                    Some(c) if !n.starts_with('0') && !n.starts_with('+') => (name, c),
                    _ => {
                        return Err(format!(
                            "lock `{text}`: the capacity after `:` must be a whole number from 1 to {MAX_CAPACITY}, e.g. `{name}:2`"
                        ))
                    }
                }
            }
            None => (text, 1),
        };
        let good_start = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
        let good_chars = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !good_start || !good_chars || name.len() > MAX_NAME {
            return Err(format!(
                "lock `{text}`: a lock's name is 1 to {MAX_NAME} of A-Z a-z 0-9 . _ - starting with a letter or digit, optionally followed by `:N` (its capacity), e.g. `apt` or `deploy:2`"
            ));
        }
        Ok(HostLock {
            name: name.to_owned(),
            capacity,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many commands may hold it at once.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The locks of one run, in the order every claim takes them (by name, so two runs
    /// never wait for each other crosswise); a lock named twice is an error naming it.
    pub fn set(locks: &[HostLock]) -> Result<Vec<HostLock>, String> {
        let mut sorted = locks.to_vec();
        sorted.sort();
        if let Some(pair) = sorted.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(format!(
                "lock `{}` is named twice (`{}` and `{}`); name each lock once",
                pair[0].name, pair[0], pair[1]
            ));
        }
        Ok(sorted)
    }

    /// A run's locks: those it names, then the policy's defaults for its command (see
    /// `locks` in command-classes.toml) by names it did not use (its own capacity wins),
    /// in the order [`HostLock::set`] gives.
    pub fn with_defaults(named: &[HostLock], defaults: &[HostLock]) -> Vec<HostLock> {
        let mut locks = named.to_vec();
        for lock in defaults {
            if !locks.iter().any(|l| l.name == lock.name) {
                locks.push(lock.clone());
            }
        }
        locks.sort();
        locks
    }

    /// The shim's `LOCKS` argument: `-` for none, else `NAME:N,...` in the order given
    /// (see [`HostLock::set`]).
    pub fn wire_list(locks: &[HostLock]) -> String {
        if locks.is_empty() {
            return "-".to_owned();
        }
        locks
            .iter()
            .map(|l| format!("{}:{}", l.name, l.capacity))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// As written on the command line (`apt`, `pool:2`): the form a plan shows.
impl serde::Serialize for HostLock {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl fmt::Display for HostLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.capacity == 1 {
            f.write_str(&self.name)
        } else {
            write!(f, "{}:{}", self.name, self.capacity)
        }
    }
}

impl std::str::FromStr for HostLock {
    type Err = String;

    fn from_str(text: &str) -> Result<HostLock, String> {
        HostLock::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_alone_is_a_lock_of_one_and_a_count_sets_its_capacity() {
        let apt = HostLock::parse("apt").unwrap();
        assert_eq!((apt.name(), apt.capacity()), ("apt", 1));
        let deploy = HostLock::parse("deploy.web-1:2").unwrap();
        assert_eq!((deploy.name(), deploy.capacity()), ("deploy.web-1", 2));
        assert_eq!(deploy.to_string(), "deploy.web-1:2");
        assert_eq!(apt.to_string(), "apt");
    }

    #[test]
    fn bad_names_and_capacities_are_refused_naming_the_fix() {
        for bad in [
            "", ":2", "-apt", ".apt", "a/b", "a b", "apt:", "apt:0", "apt:1000", "apt:x", "apt:-1",
            "apt:+2", "apt:02", "a:b:2",
        ] {
            let e = HostLock::parse(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
        assert!(HostLock::parse(&"a".repeat(64)).is_ok());
        assert!(HostLock::parse(&"a".repeat(65)).is_err());
        assert!(HostLock::parse("apt:999").is_ok());
    }

    #[test]
    fn a_runs_locks_go_in_name_order_and_a_name_counts_once() {
        let locks: Vec<HostLock> = ["zz", "apt:2", "db"]
            .iter()
            .map(|l| HostLock::parse(l).unwrap())
            .collect();
        let set = HostLock::set(&locks).unwrap();
        assert_eq!(HostLock::wire_list(&set), "apt:2,db:1,zz:1");
        assert_eq!(HostLock::wire_list(&[]), "-");
        let twice = [
            HostLock::parse("apt").unwrap(),
            HostLock::parse("apt:2").unwrap(),
        ];
        let e = HostLock::set(&twice).unwrap_err();
        assert!(e.contains("`apt` is named twice"), "{e}");
    }

    #[test]
    fn the_policys_default_locks_join_those_named_and_a_named_capacity_wins() {
        let lock = |l: &str| HostLock::parse(l).unwrap();
        let all = HostLock::with_defaults(&[lock("apt:2"), lock("zz")], &[lock("apt"), lock("db")]);
        assert_eq!(HostLock::wire_list(&all), "apt:2,db:1,zz:1");
        assert_eq!(HostLock::with_defaults(&[], &[]), []);
    }
}
