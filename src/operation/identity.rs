//! Evidence identity (docs/guarantees.md#evidence-identity): which machine, and which store of
//! evidence on it, an operation's attempts reached, as its ledger events record it, and
//! the one check every later look at that host goes through. An alias is only a name: a
//! config edit, a DNS change or another `-F` can point it at another machine (or another
//! user on the same one), and a probe there finds "absent" where the evidence is
//! elsewhere. The host key the attempts saw says "same machine"; the user and the marker
//! root id the shim reported say "same store of evidence".

use crate::host::{Changed, Refusal};
use crate::ledger::{Event, StoredEvent};
use crate::ssh::Route;

/// What the ledger says about where an operation ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The route of the latest attempt that connected.
    pub route: Option<Route>,
    /// `(attempt id, host key fingerprint)` of every attempt that connected, in order.
    pub keys: Vec<(String, String)>,
    /// `(attempt id, marker root id)` of every attempt whose shim reported its root.
    pub roots: Vec<(String, String)>,
}

/// Folds an operation's events into what they say about its host.
pub fn recorded(events: &[StoredEvent]) -> Recorded {
    let mut r = Recorded::default();
    for e in events {
        match &e.event {
            Event::Connected {
                attempt_id,
                route,
                host_key,
            } => {
                r.route = Some(route.clone());
                r.keys.push((attempt_id.clone(), host_key.clone()));
            }
            Event::MarkerRoot {
                attempt_id,
                root_id,
            } => r.roots.push((attempt_id.clone(), root_id.clone())),
            _ => {}
        }
    }
    r
}

/// A root id for people: its first 12 hex digits (the JSON carries it whole).
pub fn short_root(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

impl Recorded {
    /// Notes a connection of this invocation (so later reconnects are held to it too).
    pub fn connected(&mut self, attempt: &str, route: Route, host_key: &str) {
        self.route = Some(route);
        self.keys.push((attempt.to_owned(), host_key.to_owned()));
    }

    /// Notes the marker root an attempt of this invocation reached.
    pub fn reached_root(&mut self, attempt: &str, root_id: &str) {
        self.roots.push((attempt.to_owned(), root_id.to_owned()));
    }

    /// The marker root id the operation's attempts reached (the latest reported): every
    /// call for the operation names it, and the shim refuses when its root's differs.
    pub fn root(&self) -> Option<&str> {
        self.roots.last().map(|(_, r)| r.as_str())
    }

    /// How the operation was reached before, for a message.
    fn before(&self) -> String {
        let route = self
            .route
            .as_ref()
            .map_or_else(|| "an unrecorded route".to_owned(), Route::describe);
        match self.root() {
            Some(root) => format!("{route}, marker root {}", short_root(root)),
            None => route,
        }
    }

    /// How to reach the machine the operation ran on again: through the ssh config its
    /// attempts were reached with, which another file wins over whether it was named by
    /// `-F` or by `OPMARK_SSH_CONFIG` (often left pointing at another lab or fleet), and
    /// without `-p`/`-i`/`-J` overrides.
    fn way_back(&self) -> String {
        match self.route.as_ref().map(|r| r.config.as_ref()) {
            Some(Some(config)) => format!(
                "point -F or OPMARK_SSH_CONFIG at the ssh config it was reached with, {}, and drop the -p/-i/-J overrides",
                config.display()
            ),
            Some(None) => "it was reached with the default ~/.ssh/config: drop the -F/-p/-i/-J overrides and unset OPMARK_SSH_CONFIG".to_owned(),
            None => "check which ssh config -F or OPMARK_SSH_CONFIG names, and drop the -p/-i/-J overrides".to_owned(),
        }
    }

    /// `Err` when the host now presents a key none of the operation's attempts saw
    /// (another machine, or a changed key), or is reached as another user than the
    /// operation's latest attempt (another marker root): nothing may be concluded there.
    /// An operation with no recorded key (older ledgers) cannot be checked and passes.
    pub fn check(
        &self,
        host: &str,
        op: &str,
        seen: Option<&str>,
        route: Option<&Route>,
    ) -> Result<(), Changed> {
        let Some((_, expected)) = self.keys.last() else {
            return Ok(());
        };
        match seen {
            Some(seen) if self.keys.iter().any(|(_, k)| k == seen) => {}
            seen => {
                return Err(Changed::Key(format!(
                    "host key for {host} is now {} but operation {op} ran against {expected}; this is another machine (or the key changed): nothing concluded. It was reached before as {}. Reach the original machine ({}), or decide with `opmark resolve` once you know",
                    seen.unwrap_or("unknown"),
                    self.before(),
                    self.way_back()
                )))
            }
        }
        if let (Some(was), Some(now)) = (&self.route, route) {
            if was.user != now.user {
                return Err(Changed::Other(format!(
                    "host changed: {host} is now reached as user {} but operation {op} ran as user {} (same host key, another marker root): its evidence is not there, nothing concluded. It was reached before as {}. Reach it as {} again (`-l {}`, or the alias's User), or decide with `opmark resolve` once you know",
                    now.user,
                    was.user,
                    self.before(),
                    was.user,
                    was.user
                )));
            }
        }
        Ok(())
    }

    /// The message for a shim's `root_changed` refusal: the marker root reached is not
    /// the one the operation's attempts reached (wiped, rebuilt, another `$HOME` or
    /// `XDG_STATE_HOME`).
    pub fn root_changed(&self, host: &str, op: &str, refusal: &Refusal) -> String {
        let field = |k: &str| refusal.fields.get(k).map_or("?", String::as_str);
        let found = field("found");
        let found = if found == "none" {
            "a root with no id (new, or wiped and rebuilt)".to_owned()
        } else {
            format!("marker root {found}")
        };
        format!(
            "host changed: the marker root on {host} ({}) is {found} but operation {op} reached marker root {}: another store of evidence (wiped, rebuilt, or another user's), nothing sent and nothing concluded. It was reached before as {}. Restore the original root, or decide with `opmark resolve` once you know",
            field("root"),
            field("expected"),
            self.before()
        )
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
            roots: Vec::new(),
        }
    }

    fn route(user: &str) -> Route {
        Route {
            alias: "target1".into(),
            hostname: "127.0.0.1".into(),
            port: 2201,
            user: user.into(),
            identities: Vec::new(),
            jump: None,
            jumps: Vec::new(),
            config: None,
        }
    }

    #[test]
    fn the_key_the_operation_ran_against_passes() {
        assert_eq!(
            with_keys(&["SHA256:a"]).check("h", "op", Some("SHA256:a"), None),
            Ok(())
        );
    }

    #[test]
    fn another_key_is_another_machine_named_in_the_message() {
        let Err(Changed::Key(e)) =
            with_keys(&["SHA256:a"]).check("target1", "op-1", Some("SHA256:b"), None)
        else {
            panic!("a key mismatch")
        };
        assert!(
            e.starts_with(
                "host key for target1 is now SHA256:b but operation op-1 ran against SHA256:a; this is another machine (or the key changed): nothing concluded"
            ),
            "{e}"
        );
        assert!(with_keys(&["SHA256:a"])
            .check("h", "op", None, None)
            .is_err());
    }

    #[test]
    fn a_key_mismatch_says_which_ssh_config_reaches_the_machine_again_naming_opmark_ssh_config() {
        let changed = |config: Option<&str>| {
            let mut r = with_keys(&["SHA256:a"]);
            let mut was = route("alice");
            was.config = config.map(Into::into);
            r.route = Some(was);
            match r.check("target1", "op-1", Some("SHA256:b"), None) {
                Err(Changed::Key(e)) => e,
                other => panic!("a key mismatch, not {other:?}"),
            }
        };
        let e = changed(Some("/labs/a/ssh_config"));
        assert!(
            e.contains("point -F or OPMARK_SSH_CONFIG at the ssh config it was reached with, /labs/a/ssh_config"),
            "{e}"
        );
        let e = changed(None);
        assert!(
            e.contains(
                "default ~/.ssh/config: drop the -F/-p/-i/-J overrides and unset OPMARK_SSH_CONFIG"
            ),
            "{e}"
        );
    }

    #[test]
    fn another_user_with_the_same_key_is_another_store_named_with_the_route_before() {
        let mut r = with_keys(&["SHA256:a"]);
        r.route = Some(route("alice"));
        r.roots
            .push(("at-0".into(), "0123456789abcdef0123456789abcdef".into()));
        assert_eq!(
            r.check("target1", "op-1", Some("SHA256:a"), Some(&route("alice"))),
            Ok(())
        );
        let Err(Changed::Other(e)) =
            r.check("target1", "op-1", Some("SHA256:a"), Some(&route("bob")))
        else {
            panic!("a user change")
        };
        assert!(e.starts_with("host changed: target1 is now reached as user bob but operation op-1 ran as user alice"), "{e}");
        assert!(
            e.contains("reached before as alice@127.0.0.1:2201")
                && e.contains("marker root 0123456789ab"),
            "{e}"
        );
        assert_eq!(r.root(), Some("0123456789abcdef0123456789abcdef"));
    }

    #[test]
    fn nothing_recorded_cannot_be_checked() {
        assert_eq!(
            with_keys(&[]).check("h", "op", Some("SHA256:b"), Some(&route("x"))),
            Ok(())
        );
        assert_eq!(with_keys(&[]).root(), None);
    }

    fn stored(seq: u64, event: Event) -> StoredEvent {
        StoredEvent {
            seq,
            op_id: "op-1".into(),
            host: "target1".into(),
            at: "2026-12-05T00:00:00.000000Z".into(),
            event,
            prev_hash: "0".repeat(64),
            hash: "0".repeat(64),
        }
    }

    #[test]
    fn the_ledger_s_connections_and_marker_roots_say_where_the_operation_ran() {
        let events = [
            stored(
                1,
                Event::Connected {
                    attempt_id: "at-1".into(),
                    route: route("alice"),
                    host_key: "SHA256:a".into(),
                },
            ),
            stored(
                2,
                Event::Fenced {
                    detail: "not about the host".into(),
                },
            ),
            stored(
                3,
                Event::Connected {
                    attempt_id: "at-2".into(),
                    route: route("bob"),
                    host_key: "SHA256:b".into(),
                },
            ),
            stored(
                4,
                Event::MarkerRoot {
                    attempt_id: "at-2".into(),
                    root_id: "0123456789abcdef0123456789abcdef".into(),
                },
            ),
        ];
        let r = recorded(&events);
        assert_eq!(r.route, Some(route("bob")), "the latest attempt's route");
        assert_eq!(
            r.keys,
            vec![
                ("at-1".to_owned(), "SHA256:a".to_owned()),
                ("at-2".to_owned(), "SHA256:b".to_owned())
            ]
        );
        assert_eq!(
            r.roots,
            vec![(
                "at-2".to_owned(),
                "0123456789abcdef0123456789abcdef".to_owned()
            )]
        );
        assert_eq!(r.root(), Some("0123456789abcdef0123456789abcdef"));
    }

    #[test]
    fn a_connection_and_a_root_noted_by_this_invocation_hold_its_later_reconnects_to_them() {
        let mut r = Recorded::default();
        r.connected("at-1", route("alice"), "SHA256:a");
        r.reached_root("at-1", "0123456789abcdef0123456789abcdef");
        assert_eq!(r.route, Some(route("alice")));
        assert_eq!(r.root(), Some("0123456789abcdef0123456789abcdef"));
        assert_eq!(
            r.check("target1", "op-1", Some("SHA256:a"), Some(&route("alice"))),
            Ok(())
        );
        assert!(matches!(
            r.check("target1", "op-1", Some("SHA256:b"), Some(&route("alice"))),
            Err(Changed::Key(_))
        ));
        assert!(matches!(
            r.check("target1", "op-1", Some("SHA256:a"), Some(&route("bob"))),
            Err(Changed::Other(_))
        ));
    }

    #[test]
    fn a_root_changed_refusal_names_the_root_found_the_one_expected_and_how_it_was_reached() {
        let mut r = with_keys(&["SHA256:a"]);
        r.route = Some(route("alice"));
        r.reached_root("at-0", "0123456789abcdef0123456789abcdef");
        let refusal = |found: &str| crate::host::Refusal {
            reason: crate::host::RefusalReason::RootChanged,
            replay: false,
            marker: None,
            fields: [
                ("root", "/home/alice/.local/state/opmark"),
                ("expected", "0123456789abcdef0123456789abcdef"),
                ("found", found),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        };
        let e = r.root_changed(
            "target1",
            "op-1",
            &refusal("fedcba9876543210fedcba9876543210"),
        );
        assert!(
            e.starts_with("host changed: the marker root on target1 (/home/alice/.local/state/opmark) is marker root fedcba9876543210fedcba9876543210 but operation op-1 reached marker root 0123456789abcdef0123456789abcdef: another store of evidence"),
            "{e}"
        );
        assert!(e.contains("reached before as alice@127.0.0.1:2201"), "{e}");
        let e = r.root_changed("target1", "op-1", &refusal("none"));
        assert!(
            e.contains("is a root with no id (new, or wiped and rebuilt) but operation op-1"),
            "{e}"
        );
    }
}
