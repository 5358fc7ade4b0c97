//! Durations as the CLI writes them: `500ms`, `30s`, `5m`, `2h`, `7d`.

use std::time::Duration;

/// Parses `500ms`, `30s`, `5m`, `2h` or `7d`. A bare number is refused: the unit is
/// what keeps `--wait 30` from meaning 30 ms to one reader and 30 s to another.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
        format!("duration `{text}` has no unit; write it like 500ms, 30s, 5m, 2h or 7d")
    })?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "duration `{text}` does not start with a number; write it like 500ms, 30s, 5m, 2h or 7d"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("duration `{text}` is too large"))?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "duration `{text}` has unknown unit `{unit}`; use ms, s, m, h or d"
            ))
        }
    };
    n.checked_mul(ms_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("duration `{text}` is too large"))
}

/// A duration as [`parse_duration`] reads it back, in its largest whole unit (`90s`,
/// `1h`, `7d`, `1500ms`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, per) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= per && ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_each_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
    }

    #[test]
    fn refuses_bare_numbers_unknown_units_and_overflow() {
        assert!(parse_duration("30").unwrap_err().contains("no unit"));
        assert!(parse_duration("3w").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("s").unwrap_err().contains("does not start"));
        assert!(parse_duration("99999999999999999999d")
            .unwrap_err()
            .contains("too large"));
    }
}
