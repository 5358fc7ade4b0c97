//! Host identity (SPEC section 9): which machine an operation ran on, as its ledger
//! events record it, and the one check every later look at that host goes through. An
//! alias is only a name: a config edit, a DNS change or another `-F` can point it at
//! another machine, and a probe there finds "absent" where the evidence is elsewhere.
//! The host key the operation's attempts saw is what says "same machine".

use crate::ledger::{Event, StoredEvent};
use crate::ssh::Route;

/// What the ledger says about where an operation ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The route of the latest attempt that connected.
    pub route: Option<Route>,
    /// `(attempt id, host key fingerprint)` of every attempt that connected, in order.
    pub keys: Vec<(String, String)>,
}

/// Folds an operation's events into what they say about its host.
pub fn recorded(events: &[StoredEvent]) -> Recorded {
    let mut r = Recorded::default();
    for e in events {
        if let Event::Connected {
            attempt_id,
            route,
            host_key,
        } = &e.event
        {
            r.route = Some(route.clone());
            r.keys.push((attempt_id.clone(), host_key.clone()));
        }
    }
    r
}

impl Recorded {
    /// Notes a connection of this invocation (so later reconnects are held to it too).
    pub fn connected(&mut self, attempt: &str, route: Route, host_key: &str) {
        self.route = Some(route);
        self.keys.push((attempt.to_owned(), host_key.to_owned()));
    }

    /// `Err(message)` when the host now presents a key none of the operation's attempts
    /// saw: another machine (or a changed key), so nothing may be concluded there. An
    /// operation with no recorded key (older ledgers) cannot be checked and passes.
    pub fn check(&self, host: &str, op: &str, seen: Option<&str>) -> Result<(), String> {
        let Some((_, expected)) = self.keys.last() else {
            return Ok(());
        };
        match seen {
            Some(seen) if self.keys.iter().any(|(_, k)| k == seen) => Ok(()),
            seen => Err(format!(
                "host key for {host} is now {} but operation {op} ran against {expected}; this is another machine (or the key changed): nothing concluded. Reach the original machine (drop the -F/-p/-i/-J overrides to use the recorded route), or decide with `opmark resolve` once you know",
                seen.unwrap_or("unknown")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_keys(keys: &[&str]) -> Recorded {
        Recorded {
            route: None,
            keys: keys
                .iter()
                .enumerate()
                .map(|(i, k)| (format!("at-{i}"), (*k).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn the_key_the_operation_ran_against_passes() {
        assert_eq!(
            with_keys(&["SHA256:a"]).check("h", "op", Some("SHA256:a")),
            Ok(())
        );
    }

    #[test]
    fn another_key_is_another_machine_named_in_the_message() {
        let e = with_keys(&["SHA256:a"])
            .check("target1", "op-1", Some("SHA256:b"))
            .unwrap_err();
        assert!(
            e.starts_with(
                "host key for target1 is now SHA256:b but operation op-1 ran against SHA256:a; this is another machine (or the key changed): nothing concluded"
            ),
            "{e}"
        );
        assert!(with_keys(&["SHA256:a"]).check("h", "op", None).is_err());
    }

    #[test]
    fn nothing_recorded_cannot_be_checked() {
        assert_eq!(with_keys(&[]).check("h", "op", Some("SHA256:b")), Ok(()));
    }
}
