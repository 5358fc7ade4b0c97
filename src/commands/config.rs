//! `opmark config HOST`: how a host resolves through the ssh configs and the
//! command-line options, printed like `ssh -G` (lower-case `key value` lines) so users
//! can compare the two, or as one JSON document with `--json`. Nothing is sent.

use serde::Serialize;

use super::common;
use crate::cli::{ConfigArgs, GlobalArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};
use crate::host::{resolve, ConnectStage, Destination};

/// One resolved hop of a ProxyJump chain.
#[derive(Debug, Serialize)]
struct ResolvedHop {
    hostname: String,
    port: u16,
    user: String,
}

/// The `--json` document: the fields opmark uses, named as `ssh -G` names them.
#[derive(Debug, Serialize)]
struct ConfigReport {
    schema: &'static str,
    host: String,
    hostname: String,
    port: u16,
    user: String,
    identityfile: Vec<String>,
    certificatefile: Vec<String>,
    identitiesonly: bool,
    identityagent: Option<String>,
    userknownhostsfile: Vec<String>,
    globalknownhostsfile: Vec<String>,
    stricthostkeychecking: &'static str,
    hashknownhosts: bool,
    hostkeyalias: Option<String>,
    known_hosts_name: String,
    proxyjump: Option<String>,
    proxycommand: Option<String>,
    jumps: Vec<ResolvedHop>,
    addressfamily: &'static str,
    connectionattempts: u32,
    connecttimeout: u64,
    serveraliveinterval: u64,
    serveralivecountmax: usize,
    batchmode: bool,
    /// The algorithm lists opmark offers (the config's `KexAlgorithms`,
    /// `HostKeyAlgorithms`, `Ciphers`, `MACs`, else its defaults), comma-separated.
    kexalgorithms: String,
    hostkeyalgorithms: String,
    ciphers: String,
    macs: String,
    /// Options where opmark applies its own default because nothing set them (ssh's
    /// default differs: no connect timeout, no keepalives, `ask`).
    opmark_defaults: Vec<&'static str>,
}

fn paths(p: &[std::path::PathBuf]) -> Vec<String> {
    p.iter().map(|p| p.display().to_string()).collect()
}

fn report(d: &Destination) -> ConfigReport {
    let algorithms = crate::ssh::algorithms::offered(&d.algorithms);
    ConfigReport {
        schema: crate::ops::document::SCHEMA,
        host: d.display(),
        hostname: d.hostname.clone(),
        port: d.port,
        user: d.user.clone(),
        identityfile: paths(&d.identities),
        certificatefile: paths(&d.certificate_files),
        identitiesonly: d.identities_only,
        identityagent: d.agent_socket.as_ref().map(|p| p.display().to_string()),
        userknownhostsfile: paths(&d.known_hosts),
        globalknownhostsfile: paths(&d.global_known_hosts),
        stricthostkeychecking: d.strict.as_str(),
        hashknownhosts: d.hash_known_hosts,
        hostkeyalias: d.host_key_alias.clone(),
        known_hosts_name: d.known_hosts_name(),
        proxyjump: d.proxy_jump.clone(),
        proxycommand: d.proxy_command.as_ref().map(|p| p.raw.clone()),
        jumps: d
            .jumps
            .iter()
            .map(|j| ResolvedHop {
                hostname: j.hostname.clone(),
                port: j.port,
                user: j.user.clone(),
            })
            .collect(),
        addressfamily: d.address_family.as_str(),
        connectionattempts: d.connection_attempts,
        connecttimeout: d.connect_timeout.as_secs(),
        serveraliveinterval: d.keepalive_interval.map_or(0, |i| i.as_secs()),
        serveralivecountmax: d.keepalive_max,
        batchmode: d.batch_mode,
        kexalgorithms: algorithms[0].clone(),
        hostkeyalgorithms: algorithms[1].clone(),
        ciphers: algorithms[2].clone(),
        macs: algorithms[3].clone(),
        opmark_defaults: d.opmark_defaults.clone(),
    }
}

/// `ssh -G` style text: one `key value` line per field, lists one line per entry for
/// identity and certificate files (as ssh prints them), space-joined for known_hosts.
fn render(r: &ConfigReport) -> String {
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let mut out = String::new();
    let mut line = |k: &str, v: &str| out.push_str(&format!("{k} {v}\n"));
    line("host", &r.host);
    line("hostname", &r.hostname);
    line("port", &r.port.to_string());
    line("user", &r.user);
    for f in &r.identityfile {
        line("identityfile", f);
    }
    for f in &r.certificatefile {
        line("certificatefile", f);
    }
    line("identitiesonly", yes_no(r.identitiesonly));
    if let Some(a) = &r.identityagent {
        line("identityagent", a);
    }
    line("userknownhostsfile", &r.userknownhostsfile.join(" "));
    line("globalknownhostsfile", &r.globalknownhostsfile.join(" "));
    line("stricthostkeychecking", r.stricthostkeychecking);
    line("hashknownhosts", yes_no(r.hashknownhosts));
    if let Some(a) = &r.hostkeyalias {
        line("hostkeyalias", a);
    }
    if let Some(j) = &r.proxyjump {
        line("proxyjump", j);
    }
    if let Some(c) = &r.proxycommand {
        line("proxycommand", c);
    }
    line("addressfamily", r.addressfamily);
    line("connectionattempts", &r.connectionattempts.to_string());
    line("connecttimeout", &r.connecttimeout.to_string());
    line("serveraliveinterval", &r.serveraliveinterval.to_string());
    line("kexalgorithms", &r.kexalgorithms);
    line("hostkeyalgorithms", &r.hostkeyalgorithms);
    line("ciphers", &r.ciphers);
    line("macs", &r.macs);
    line("serveralivecountmax", &r.serveralivecountmax.to_string());
    line("batchmode", yes_no(r.batchmode));
    for k in &r.opmark_defaults {
        out.push_str(&format!(
            "# {k}: opmark's default (the config does not set it)\n"
        ));
    }
    out
}

/// Resolves and prints; a config problem exits 246, a bad host argument 245.
pub fn run(global: &GlobalArgs, args: &ConfigArgs) -> Result<u8> {
    let spec = common::host_spec(global, &args.host, &args.host_args);
    let dest = resolve(&spec).map_err(|e| {
        let kind = match e.stage {
            ConnectStage::Config => ErrorKind::Config,
            _ => ErrorKind::InvalidInput,
        };
        Error::new(kind, e.message)
    })?;
    let r = report(&dest);
    if global.json {
        common::print_json(&r)?;
    } else {
        crate::out!("{}", render(&r));
    }
    Ok(exit_code::OK)
}
