//! Network-namespace placement: each target alone in a namespace behind a veth pair,
//! and `cut`/`restore`, which silently drop every packet of its link and bring it back.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use super::error::LabError;
use super::sshd::run;

/// Addresses come from 198.18.0.0/15 (RFC 2544, reserved for benchmarking networks),
/// one /30 per namespace, so they never clash with real networks on the machine.
const BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
/// Number of /30 blocks in the /15.
const SLOTS: u32 = 1 << 15;
/// nftables table that a cut installs inside the target's namespace.
const CUT_TABLE: &str = "opmark_lab_cut";

/// A namespace slot: its name, its interfaces and its /30.
#[derive(Debug, Clone)]
pub(crate) struct NsSlot {
    /// Namespace name, `omk<index>`.
    pub ns: String,
    /// Host-side veth (in the root namespace).
    pub host_if: String,
    /// Target-side veth (inside the namespace).
    pub ns_if: String,
    /// The target's address (host side is one below).
    pub addr: Ipv4Addr,
}

impl NsSlot {
    fn new(index: u32) -> NsSlot {
        let net = BASE + index * 4;
        NsSlot {
            ns: format!("omk{index}"),
            // ≤ 15 characters: "omk" + at most 5 digits + 1.
            host_if: format!("omk{index}h"),
            ns_if: format!("omk{index}n"),
            addr: Ipv4Addr::from(net + 2),
        }
    }

    fn host_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) - 1)
    }
}

/// Creates a fresh namespace with a veth link to it. The namespace name is the lock:
/// `ip netns add` fails when the name exists, so parallel labs never share a slot.
pub(crate) fn create() -> Result<NsSlot, LabError> {
    let mut last = None;
    for _ in 0..64 {
        let slot = NsSlot::new(rand::random_range(0..SLOTS));
        match run(Command::new("ip").args(["netns", "add", &slot.ns])) {
            Ok(_) => {
                if let Err(e) = wire(&slot) {
                    destroy(&slot.ns, Some(&slot.host_if));
                    return Err(e);
                }
                return Ok(slot);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| LabError::Command {
        command: "ip netns add".into(),
        detail: "no free namespace slot".into(),
    }))
}

fn wire(slot: &NsSlot) -> Result<(), LabError> {
    let ip = |args: &[&str]| run(Command::new("ip").args(args)).map(|_| ());
    let in_ns = |args: &[&str]| {
        run(Command::new("ip")
            .args(["netns", "exec", &slot.ns, "ip"])
            .args(args))
        .map(|_| ())
    };
    let host_cidr = format!("{}/30", slot.host_addr());
    let ns_cidr = format!("{}/30", slot.addr);
    ip(&[
        "link",
        "add",
        &slot.host_if,
        "type",
        "veth",
        "peer",
        "name",
        &slot.ns_if,
    ])?;
    ip(&["link", "set", &slot.ns_if, "netns", &slot.ns])?;
    ip(&["addr", "add", &host_cidr, "dev", &slot.host_if])?;
    ip(&["link", "set", &slot.host_if, "up"])?;
    in_ns(&["addr", "add", &ns_cidr, "dev", &slot.ns_if])?;
    in_ns(&["link", "set", &slot.ns_if, "up"])?;
    in_ns(&["link", "set", "lo", "up"])?;
    Ok(())
}

/// Deletes the veth (both ends go together) and the namespace; missing ones are fine.
pub(crate) fn destroy(ns: &str, host_if: Option<&str>) {
    if let Some(host_if) = host_if {
        let _ = run(Command::new("ip").args(["link", "del", host_if]));
    }
    let _ = run(Command::new("ip").args(["netns", "del", ns]));
}

/// Pids of every process inside the namespace.
pub(crate) fn pids(ns: &str) -> Vec<i32> {
    run(Command::new("ip").args(["netns", "pids", ns]))
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Drops every packet into and out of the namespace's veth, before connection tracking
/// (priority raw), so nothing answers: no RST, no FIN, no ICMP. Idempotent.
pub(crate) fn cut(ns: &str, ns_if: &str) -> Result<(), LabError> {
    let rules = format!(
        "table inet {CUT_TABLE} {{\n\
         \tchain input {{ type filter hook input priority raw; policy accept; iifname \"{ns_if}\" drop; }}\n\
         \tchain output {{ type filter hook output priority raw; policy accept; oifname \"{ns_if}\" drop; }}\n\
         }}\n"
    );
    let _ = restore(ns);
    nft(ns, &rules)
}

/// Removes the cut. Idempotent.
pub(crate) fn restore(ns: &str) -> Result<(), LabError> {
    let listed = run(Command::new("ip").args(["netns", "exec", ns, "nft", "list", "tables"]))?;
    if String::from_utf8_lossy(&listed.stdout).contains(CUT_TABLE) {
        nft(ns, &format!("delete table inet {CUT_TABLE}\n"))?;
    }
    Ok(())
}

/// True when the target's link is currently cut.
pub(crate) fn is_cut(ns: &str) -> bool {
    run(Command::new("ip").args(["netns", "exec", ns, "nft", "list", "tables"]))
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(CUT_TABLE))
        .unwrap_or(false)
}

fn nft(ns: &str, script: &str) -> Result<(), LabError> {
    super::sshd::require_on_path("nft", "nftables")?;
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| LabError::Command {
            command: "nft".into(),
            detail: e.to_string(),
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| LabError::Command {
        command: "nft".into(),
        detail: e.to_string(),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LabError::Command {
            command: format!("ip netns exec {ns} nft -f -"),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// The target's address as an `IpAddr`.
pub(crate) fn ip(slot: &NsSlot) -> IpAddr {
    IpAddr::V4(slot.addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fit_interface_name_limit_and_stay_in_the_benchmark_range() {
        let last = NsSlot::new(SLOTS - 1);
        assert!(last.host_if.len() <= 15 && last.ns_if.len() <= 15);
        assert_eq!(last.addr, Ipv4Addr::new(198, 19, 255, 254));
        assert_eq!(last.host_addr(), Ipv4Addr::new(198, 19, 255, 253));
        let first = NsSlot::new(0);
        assert_eq!(first.addr, Ipv4Addr::new(198, 18, 0, 2));
    }
}
