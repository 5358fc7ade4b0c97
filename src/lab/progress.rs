//! What a cold lab image build shows while it runs: one start line, then on a terminal
//! one status line for the phase under way (which phase of how many, the seconds it has
//! taken against what it usually takes, the tool's last line), redrawn every half second
//! so that no phase is silent (issue 28: docker import showed nothing for ~23 s), cut to
//! the terminal's width and taken off when the build ends; each finished phase leaves one
//! short line. Without a terminal only the permanent lines are written.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One phase of a build: its name and how long it usually takes (what the user is told;
/// never a promise, and said as "longer than usual" once it is passed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Phase {
    pub name: &'static str,
    pub usual: Duration,
}

/// The phase under way and the tool's last line, shared with the ticker.
#[derive(Debug, Default)]
struct Now {
    /// Index into the phases.
    phase: usize,
    started: Option<Instant>,
    detail: String,
}

/// A build's progress (see the module header). Dropping it takes the status line off.
pub(crate) struct BuildProgress {
    phases: &'static [Phase],
    now: Arc<Mutex<Now>>,
    stop: Arc<AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
    began: Instant,
}

impl BuildProgress {
    /// Says that `tag` is being built, once, and how long that usually takes; on a
    /// terminal starts the status line.
    pub(crate) fn start(tag: &str, phases: &'static [Phase]) -> BuildProgress {
        let usual: Duration = phases.iter().map(|p| p.usual).sum();
        // Short enough for 80 columns with the lab's tags (about 30 characters).
        crate::say!(
            "opmark: building image {tag} once (usually {})",
            about(usual)
        );
        let now = Arc::new(Mutex::new(Now::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = std::io::stderr().is_terminal().then(|| {
            let (now, stop) = (now.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let line = status_line(phases, &lock(&now));
                    if let Some(line) = line {
                        crate::logging::set_status(Some(&line));
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        });
        BuildProgress {
            phases,
            now,
            stop,
            ticker,
            began: Instant::now(),
        }
    }

    /// Phase `i` (0-based) begins: drawn at once, not half a second later.
    pub(crate) fn phase(&self, i: usize) {
        let mut now = lock(&self.now);
        now.phase = i;
        now.started = Some(Instant::now());
        now.detail.clear();
        self.draw(&now);
    }

    /// The tool's latest line, shown after the phase's time.
    pub(crate) fn detail(&self, line: &str) {
        let mut now = lock(&self.now);
        now.detail = crate::text::printable(line);
        self.draw(&now);
    }

    /// The phase under way ended well: one permanent line with its time.
    pub(crate) fn phase_done(&self) {
        let now = lock(&self.now);
        let took = now.started.map_or(Duration::ZERO, |s| s.elapsed());
        let phase = self.phases[now.phase];
        crate::say!(
            "opmark: image {}/{} {} done in {} s",
            now.phase + 1,
            self.phases.len(),
            phase.name,
            took.as_secs()
        );
    }

    /// The whole build ended well: the status line goes, one line says how long it took.
    pub(crate) fn finish(mut self) {
        self.stop_ticker();
        crate::say!(
            "opmark: lab image built in {} s",
            self.began.elapsed().as_secs()
        );
    }

    fn draw(&self, now: &Now) {
        if self.ticker.is_some() {
            if let Some(line) = status_line(self.phases, now) {
                crate::logging::set_status(Some(&line));
            }
        }
    }

    fn stop_ticker(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
            crate::logging::set_status(None);
        }
    }
}

impl Drop for BuildProgress {
    fn drop(&mut self) {
        // A failed build: the error follows on a clean line.
        self.stop_ticker();
    }
}

fn lock(now: &Mutex<Now>) -> std::sync::MutexGuard<'_, Now> {
    now.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `opmark: image 1/2 debootstrap 41 s (usually ~1 min 40 s): Retrieving libc6`; None
/// before the first phase began. The caller's status line cuts it to the terminal.
fn status_line(phases: &[Phase], now: &Now) -> Option<String> {
    let started = now.started?;
    let phase = phases[now.phase];
    let took = started.elapsed();
    let against = if took > phase.usual {
        format!("longer than the usual {}", about(phase.usual))
    } else {
        format!("usually {}", about(phase.usual))
    };
    let mut line = format!(
        "opmark: image {}/{} {} {} s ({against})",
        now.phase + 1,
        phases.len(),
        phase.name,
        took.as_secs()
    );
    if !now.detail.is_empty() {
        line.push_str(": ");
        line.push_str(&now.detail);
    }
    Some(line)
}

/// A usual duration in words people read at a glance: `~20 s`, `~2 min`.
fn about(d: Duration) -> String {
    let s = d.as_secs();
    if s < 90 {
        format!("~{} s", s.max(1))
    } else {
        format!("~{} min", (s + 30) / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PHASES: &[Phase] = &[
        Phase {
            name: "debootstrap",
            usual: Duration::from_secs(100),
        },
        Phase {
            name: "docker import",
            usual: Duration::from_secs(23),
        },
    ];

    #[test]
    fn usual_times_read_in_seconds_then_minutes() {
        assert_eq!(about(Duration::from_secs(23)), "~23 s");
        assert_eq!(about(Duration::from_millis(300)), "~1 s");
        assert_eq!(about(Duration::from_secs(123)), "~2 min");
        assert_eq!(about(Duration::from_secs(100)), "~2 min");
    }

    #[test]
    fn the_status_line_names_the_phase_and_says_when_it_runs_longer_than_usual() {
        assert_eq!(status_line(PHASES, &Now::default()), None, "nothing began");
        let now = Now {
            phase: 1,
            started: Some(Instant::now()),
            detail: String::new(),
        };
        let line = status_line(PHASES, &now).unwrap();
        assert!(
            line.starts_with("opmark: image 2/2 docker import 0 s (usually ~23 s)"),
            "{line}"
        );
        let late = Now {
            phase: 0,
            started: Instant::now().checked_sub(Duration::from_secs(150)),
            detail: "Retrieving libc6".into(),
        };
        let line = status_line(PHASES, &late).unwrap();
        assert!(
            line.contains("1/2 debootstrap 150 s (longer than the usual ~2 min): Retrieving libc6"),
            "{line}"
        );
    }
}
