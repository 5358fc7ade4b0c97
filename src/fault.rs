//! Fault points for the crash tests: with the `test-hooks` feature, `OPMARK_FAULT=<point>`
//! makes this process die by SIGKILL at that point (`before_dispatch`, `after_dispatch`,
//! `after_started`, `after_exit`), as a crash or `kill -9` would, to prove what a crash
//! there leaves behind. Without the feature (every release build) a point is nothing,
//! and the variable means nothing.

/// Dies here when `OPMARK_FAULT` names `point` (test builds only).
#[cfg(feature = "test-hooks")]
pub fn point(point: &str) {
    if std::env::var("OPMARK_FAULT").is_ok_and(|p| p == point) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &std::process::id().to_string()])
            .status();
        // kill(1) missing: die without cleanup all the same.
        std::process::abort();
    }
}

/// Nothing: fault points exist only with the `test-hooks` feature.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn point(_point: &str) {}
