//! Command families (docs/trust.md#the-policy), ordered from least to most dangerous.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a command does to the world, which decides what may happen after an unknown
/// outcome. The order is the danger order: `ReadOnly < Convergent < AppendOnly < Destructive`.
/// Also the values of `--class` (clap's kebab-case names are [`Family::as_str`]'s).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    /// Reads only; running it again changes nothing.
    ReadOnly,
    /// Drives the world to a state; running it twice equals running it once.
    Convergent,
    /// Each run adds something (a log line, a queued job, a row).
    AppendOnly,
    /// Each run may destroy or irreversibly change something.
    Destructive,
}

impl Family {
    /// Every family, least dangerous first.
    pub const ALL: [Family; 4] = [
        Family::ReadOnly,
        Family::Convergent,
        Family::AppendOnly,
        Family::Destructive,
    ];

    /// The name used in the policy file, the CLI, JSON and the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::ReadOnly => "read-only",
            Family::Convergent => "convergent",
            Family::AppendOnly => "append-only",
            Family::Destructive => "destructive",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Family {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Family::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown family `{s}`; expected one of read-only, convergent, append-only, destructive"
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_the_danger_order_and_names_round_trip() {
        assert!(Family::ReadOnly < Family::Convergent);
        assert!(Family::Convergent < Family::AppendOnly);
        assert!(Family::AppendOnly < Family::Destructive);
        for f in Family::ALL {
            assert_eq!(f.as_str().parse::<Family>(), Ok(f));
        }
        assert!("safe"
            .parse::<Family>()
            .unwrap_err()
            .contains("unknown family"));
    }
}
