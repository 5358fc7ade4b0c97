//! Who runs the lab: root may place targets in network namespaces, and every target's
//! login user is the user who started the lab.

use super::error::LabError;
use super::sshd;

/// The effective uid; geteuid cannot fail (rustix: no unsafe code here).
pub fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The login name of the effective user.
pub(super) fn current_user() -> Result<String, LabError> {
    let out = sshd::run(std::process::Command::new("id").arg("-un"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
