//! Signals to the client (docs/guarantees.md#interruptions-and-cancel): the first SIGINT, SIGTERM or SIGHUP is
//! turned into a value the run answers with (record the boundary, tell the caller the
//! command keeps running and the two ways on); a second one exits at once.
//!
//! Without handlers the default action killed opmark mid-sentence (exit -2 for SIGINT)
//! with nothing recorded and nothing said, while the detached command ran on.

use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// A signal that interrupts `opmark run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientSignal {
    /// SIGINT (Ctrl-C).
    Int,
    /// SIGTERM (a supervisor stopping us).
    Term,
    /// SIGHUP (the terminal went away).
    Hup,
}

impl ClientSignal {
    /// The signal's name without `SIG`, as the ledger records it.
    pub fn name(self) -> &'static str {
        match self {
            ClientSignal::Int => "INT",
            ClientSignal::Term => "TERM",
            ClientSignal::Hup => "HUP",
        }
    }

    /// The shell convention 128 + signal number, so a caller's `$?` reads as usual.
    pub fn exit_code(self) -> u8 {
        match self {
            ClientSignal::Int => 130,
            ClientSignal::Term => 143,
            ClientSignal::Hup => 129,
        }
    }
}

impl fmt::Display for ClientSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SIG{}", self.name())
    }
}

/// The first interrupting signal, shared between the handler task and the run.
#[derive(Debug, Clone)]
pub struct Interrupts {
    first: watch::Receiver<Option<ClientSignal>>,
    /// What the second signal's last words name (the op id and host), set once known.
    context: Arc<Mutex<Option<String>>>,
}

impl Interrupts {
    /// Catches SIGINT, SIGTERM and SIGHUP from now on, for the rest of the process. Must
    /// be called inside a tokio runtime. The first signal is kept for [`Self::wait`]; a
    /// second one prints one line and exits the process at once with its code.
    pub fn install() -> std::io::Result<Interrupts> {
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        let (tx, first) = watch::channel(None);
        let context = Arc::new(Mutex::new(None::<String>));
        let last_words = context.clone();
        tokio::spawn(async move {
            loop {
                let got = tokio::select! {
                    Some(()) = int.recv() => ClientSignal::Int,
                    Some(()) = term.recv() => ClientSignal::Term,
                    Some(()) = hup.recv() => ClientSignal::Hup,
                    else => return,
                };
                if tx.borrow().is_none() {
                    tx.send_replace(Some(got));
                    // Said at once: recording may wait on a busy ledger. Write errors are
                    // ignored (after SIGHUP the terminal may be gone).
                    crate::logging::say(format_args!(
                        "opmark: {got}: recording how far the operation got, then exiting ({got} again exits at once)"
                    ));
                    continue;
                }
                // The caller insists: no more ledger writes or network waits.
                let about = last_words
                    .lock()
                    .map(|c| c.clone())
                    .unwrap_or_default()
                    .map(|c| format!("; {c}"))
                    .unwrap_or_default();
                crate::logging::say(format_args!("opmark: {got} again: exiting at once{about}"));
                std::process::exit(i32::from(got.exit_code()));
            }
        });
        Ok(Interrupts { first, context })
    }

    /// Interrupts that never fire (library callers that handle signals themselves).
    pub fn never() -> Interrupts {
        let (tx, first) = watch::channel(None);
        // Kept alive for the process: a dropped sender would end `wait`.
        std::mem::forget(tx);
        Interrupts {
            first,
            context: Arc::new(Mutex::new(None)),
        }
    }

    /// The first signal, if one came.
    pub fn received(&self) -> Option<ClientSignal> {
        *self.first.borrow()
    }

    /// Waits for the first signal.
    pub async fn wait(&self) -> ClientSignal {
        let mut rx = self.first.clone();
        let got = match rx.wait_for(Option::is_some).await {
            Ok(sig) => *sig,
            Err(_) => None,
        };
        match got {
            Some(sig) => sig,
            // The handler task is gone (the runtime is shutting down): never fires.
            None => std::future::pending().await,
        }
    }

    /// What a second signal's message should name (e.g. the op id and the ways on).
    pub fn set_context(&self, text: String) {
        if let Ok(mut c) = self.context.lock() {
            *c = Some(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(ClientSignal::Int.exit_code(), 130);
        assert_eq!(ClientSignal::Term.exit_code(), 143);
        assert_eq!(ClientSignal::Hup.exit_code(), 129);
        assert_eq!(ClientSignal::Hup.to_string(), "SIGHUP");
    }
}
