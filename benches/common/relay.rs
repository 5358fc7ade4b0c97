//! A TCP relay for the benchmarks that stands in for a real network: it holds every
//! chunk a fixed delay before passing it on (throughput is untouched: chunks queue, they
//! do not wait for each other) and logs when each chunk arrived, from which side, and its
//! bytes, so that a bench can count the round trips a call waited for (`exchanges`) or
//! name them by what they carried (benches/latency.rs reads the clear-text handshake
//! from the bytes). Shared by the benches that include it with `#[path]`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The relay: listen on `port`, forward to the upstream given to [`Relay::start`].
pub struct Relay {
    /// The loopback port it listens on.
    pub port: u16,
    /// The delay each way.
    pub delay: Duration,
    log: Arc<Mutex<Vec<Chunk>>>,
}

/// One read from one side of the relay.
#[derive(Clone)]
pub struct Chunk {
    /// When the relay read it (it is delivered `delay` later).
    pub at: Instant,
    /// Sent by the client (else by the server).
    pub from_client: bool,
    /// What was read.
    pub bytes: Vec<u8>,
}

impl Relay {
    /// Starts a relay to `upstream` that delays each chunk `delay` each way.
    pub fn start(upstream: SocketAddr, delay: Duration) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let port = listener.local_addr().unwrap().port();
        let log: Arc<Mutex<Vec<Chunk>>> = Arc::default();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                for s in [&client, &server] {
                    s.set_nodelay(true).ok();
                }
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                pump(client, s2, true, delay, log2.clone());
                pump(server, c2, false, delay, log2.clone());
            }
        });
        Relay { port, delay, log }
    }

    /// Forgets what was logged so far.
    pub fn clear(&self) {
        self.log.lock().unwrap().clear();
    }

    /// What was logged so far, in the order the relay read it.
    pub fn chunks(&self) -> Vec<Chunk> {
        let mut log = self.log.lock().unwrap().clone();
        log.sort_by_key(|c| c.at);
        log
    }

    /// Round trips the client waited for on connections that already existed: each
    /// flight of client chunks that a flight of server chunks answered (no TCP
    /// handshake counted). A final client flight nobody answers is not waited for.
    pub fn exchanges(&self) -> usize {
        let mut flights: Vec<bool> = Vec::new();
        for c in self.chunks() {
            if flights.last() != Some(&c.from_client) {
                flights.push(c.from_client);
            }
        }
        flights.windows(2).filter(|w| w[0] && !w[1]).count()
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    from_client: bool,
    delay: Duration,
    log: Arc<Mutex<Vec<Chunk>>>,
) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        for (at, bytes) in rx {
            let due = at + delay;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                return;
            }
        }
        to.shutdown(std::net::Shutdown::Write).ok();
    });
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            let now = Instant::now();
            log.lock().unwrap().push(Chunk {
                at: now,
                from_client,
                bytes: buf[..n].to_vec(),
            });
            if tx.send((now, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
}

/// An ssh_config (`BASE/ssh_config.wan`) with an alias `wan1` for the lab's target1
/// through a new relay delaying `delay` each way (the target's host key kept), and the
/// relay.
pub fn wan1(
    lab: &opmark::lab::Lab,
    base: &std::path::Path,
    delay: Duration,
) -> (std::path::PathBuf, Relay) {
    let target = lab.target("target1").unwrap();
    let relay = Relay::start(SocketAddr::new(target.addr, target.port), delay);
    let wan_cfg = base.join("ssh_config.wan");
    let lab_cfg = std::fs::read_to_string(lab.ssh_config()).unwrap();
    std::fs::write(
        &wan_cfg,
        format!(
            "Host wan1\n  HostName 127.0.0.1\n  Port {}\n  HostKeyAlias {}\n  User {}\n  \
             IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  \
             StrictHostKeyChecking yes\n\n{lab_cfg}",
            relay.port,
            target.known_hosts_host(),
            target.user,
            lab.client_key().display(),
            lab.known_hosts().display(),
        ),
    )
    .unwrap();
    (wan_cfg, relay)
}
