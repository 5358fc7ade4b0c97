//! Finding and signalling the processes a lab target owns (its sshd listener, the
//! per-connection sshd processes, and commands run with the target's state dir).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

/// One row of /proc: pid, parent pid and command name.
#[derive(Debug, Clone)]
pub(crate) struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
}

/// Every process visible in /proc (processes that vanish mid-scan are skipped).
pub(crate) fn all() -> Vec<ProcInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(info)
        .collect()
}

/// /proc/PID/stat parsed after the last ") " because comm may contain spaces and parens.
pub(crate) fn info(pid: i32) -> Option<ProcInfo> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = stat.find('(')?;
    let close = stat.rfind(") ")?;
    let comm = stat.get(open + 1..close)?.to_string();
    let mut rest = stat.get(close + 2..)?.split(' ');
    let state = rest.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    let ppid = rest.next()?.parse().ok()?;
    Some(ProcInfo { pid, ppid, comm })
}

/// True while `pid` exists and is not a zombie.
pub(crate) fn alive(pid: i32) -> bool {
    info(pid).is_some()
}

/// `root` and all its descendants, from one snapshot of /proc.
pub(crate) fn descendants(procs: &[ProcInfo], root: i32) -> BTreeSet<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut found = BTreeSet::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        if found.insert(pid) {
            stack.extend(children.get(&pid).into_iter().flatten().copied());
        }
    }
    found
}

/// Processes whose environment holds exactly `NAME=value`: commands started through a
/// target (sshd's `SetEnv` puts the target's XDG_STATE_HOME there), including ones
/// that detached from their session and so are no longer below the sshd listener.
pub(crate) fn with_env(procs: &[ProcInfo], entry: &str) -> BTreeSet<i32> {
    let needle = entry.as_bytes();
    procs
        .iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{}/environ", p.pid))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle))
                .unwrap_or(false)
        })
        .map(|p| p.pid)
        .collect()
}

/// Reads a pid file; None when absent or unparsable.
pub(crate) fn read_pid_file(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Sends `signal` to `pid`; an already gone process is not an error.
#[allow(unsafe_code)] // kill(2) has no memory-safety preconditions; libc only exposes it as unsafe.
pub(crate) fn signal(pid: i32, signal: i32) {
    if pid <= 1 {
        return; // never signal init or "every process" by accident
    }
    // SAFETY: plain syscall with integer arguments.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// SIGKILLs every pid and waits (bounded) until they are gone.
pub(crate) fn kill_all(pids: &BTreeSet<i32>, wait: Duration) -> bool {
    let own = std::process::id() as i32;
    for &pid in pids {
        if pid != own {
            signal(pid, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + wait;
    loop {
        if pids.iter().all(|&p| p == own || !alive(p)) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_found_alive_with_its_parent() {
        let me = std::process::id() as i32;
        let info = info(me).expect("own /proc entry");
        assert!(info.ppid > 0);
        assert!(alive(me));
        assert!(descendants(&all(), info.ppid).contains(&me));
    }
}
