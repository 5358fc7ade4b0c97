//! `opmark keeper` (older name `mux`): the connection keeper (docs/trust.md#the-keeper) for people: `status`, `stop`, and the
//! hidden `serve` that opmark starts by itself, through [`crate::host::keeper`].

use crate::cli::{GlobalArgs, KeeperAction, KeeperArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::host::keeper::{self, KeeperDir, KeeperReply, KeeperRequest, DEFAULT_PERSIST};

/// Runs one `keeper` action.
pub fn run(global: &GlobalArgs, args: &KeeperArgs) -> Result<u8> {
    match &args.action {
        KeeperAction::Serve { dir } => {
            let dir = match dir {
                Some(d) => d.clone(),
                None => KeeperDir::default_dir().map_err(local)?,
            };
            let persist = if global.persist.is_zero() {
                DEFAULT_PERSIST
            } else {
                global.persist
            };
            keeper::serve(&dir, persist).map_err(local)?;
            Ok(exit_code::OK)
        }
        KeeperAction::Status => ask(global, KeeperRequest::Status),
        KeeperAction::Stop => ask(global, KeeperRequest::Stop),
    }
}

fn local(message: String) -> Error {
    Error::new(ErrorKind::LocalIo, message)
}

/// Sends `request` to a running keeper (never starts one) and prints the answer.
fn ask(global: &GlobalArgs, request: KeeperRequest) -> Result<u8> {
    let place = KeeperDir::open_default().map_err(local)?;
    let reply = super::common::block_on(keeper::control(&place, &request))?.map_err(local)?;
    let stopping = matches!(request, KeeperRequest::Stop);
    if global.json {
        let doc = match &reply {
            None => serde_json::json!({ "running": false, "dir": place.dir }),
            Some(KeeperReply::Status {
                pid,
                persist_secs,
                idle_secs,
                callers,
                connections,
            }) => serde_json::json!({
                "running": true, "dir": place.dir, "pid": pid, "persist_secs": persist_secs,
                "idle_secs": idle_secs, "callers": callers, "connections": connections,
            }),
            Some(KeeperReply::Stopping { pid }) => {
                serde_json::json!({ "running": false, "stopped": true, "pid": pid })
            }
            Some(other) => serde_json::json!({ "running": true, "answer": format!("{other:?}") }),
        };
        super::common::print_json(&doc)?;
        return Ok(exit_code::OK);
    }
    match reply {
        None if stopping => {
            crate::outln!("no connection keeper is running ({})", place.dir.display())
        }
        None => crate::outln!(
            "no connection keeper is running ({}); the next opmark run starts one",
            place.dir.display()
        ),
        Some(KeeperReply::Stopping { pid }) => {
            crate::outln!("stopped the connection keeper (pid {pid})")
        }
        Some(KeeperReply::Status {
            pid,
            persist_secs,
            idle_secs,
            callers,
            connections,
        }) => {
            crate::outln!(
                "connection keeper pid {pid} at {}: persist {persist_secs}s, idle {idle_secs}s, \
                 {callers} caller(s), {} connection(s)",
                place.dir.display(),
                connections.len()
            );
            for c in connections {
                // Channels count the idle residents too: they hold places under the limit.
                let residents = match &c.no_resident {
                    Some(why) => format!("residents off ({why})"),
                    None => format!("residents {} idle", c.idle_residents),
                };
                crate::outln!(
                    "  {}  channels {}/{}  {residents}  used {}  age {}s  host key {}",
                    c.destination,
                    c.channels,
                    c.max_channels,
                    c.used,
                    c.age_secs,
                    c.host_key.as_deref().unwrap_or("-")
                );
            }
        }
        Some(other) => crate::outln!("the keeper answered {other:?}"),
    }
    Ok(exit_code::OK)
}
