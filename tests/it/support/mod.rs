//! Test harness: sealed environments and disposable sshd targets.
