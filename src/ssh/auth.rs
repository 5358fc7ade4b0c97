//! Public-key authentication: identity files (ed25519, ECDSA, RSA with rsa-sha2-*),
//! encrypted keys through ssh-agent, `SSH_ASKPASS` or a terminal prompt, the agent's own
//! keys, and OpenSSH user certificates (`CertificateFile`, `<key>-cert.pub`, or held by
//! the agent), each tried before the plain key it certifies.
//! A failure lists what was tried (paths, agent key comments), never key material.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use russh::client::{AuthResult, Handle, Handler};
use russh::keys::agent::client::AgentClient;
use russh::keys::agent::AgentIdentity;
use russh::keys::{Algorithm, Certificate, HashAlg, PrivateKey, PrivateKeyWithHashAlg, PublicKey};

use super::destination::Destination;
use super::error::{ConnectError, ConnectStage};

type Agent = AgentClient<tokio::net::UnixStream>;

/// Set by `opmark mcp`: a server has no person at a terminal, whatever its stdin is.
static NEVER_PROMPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// No passphrase prompt for the rest of the process (`opmark mcp`).
pub fn forbid_prompts() {
    NEVER_PROMPT.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// A passphrase may be asked only when a person can answer (docs/guarantees.md#the-command-line-contract): a terminal on
/// stdin and `BatchMode` off. An agent running opmark with piped stdin, or under a pty
/// with `BatchMode yes`, must get an answer at once, never a prompt that hangs it.
pub(crate) fn may_prompt(dest: &Destination) -> bool {
    use std::io::IsTerminal as _;
    !dest.batch_mode
        && !NEVER_PROMPT.load(std::sync::atomic::Ordering::Relaxed)
        && std::io::stdin().is_terminal()
}

/// Tries the destination's identities in OpenSSH's spirit: identity files first (through
/// the agent when it holds the key, so an encrypted key needs no prompt), then, unless
/// `IdentitiesOnly`, the agent's other keys. Generic over the connection's handler: the
/// session's handler asks this module whether it may prompt, so naming it here would be
/// an import circle.
pub(crate) async fn authenticate<H: Handler>(
    handle: &mut Handle<H>,
    dest: &Destination,
) -> Result<(), ConnectError> {
    let mut a = AuthAttempt {
        handle,
        dest,
        tried: Vec::new(),
        rsa_hash: None,
    };
    let mut agent = None;
    let mut agent_keys: Vec<(PublicKey, String)> = Vec::new();
    let mut agent_certs: Vec<(Certificate, String)> = Vec::new();
    if let Some(sock) = &dest.agent_socket {
        match AgentClient::connect_uds(sock).await {
            Ok(mut client) => match client.request_identities().await {
                Ok(ids) => {
                    for id in ids {
                        match id {
                            AgentIdentity::PublicKey { key, comment } => {
                                agent_keys.push((key, comment))
                            }
                            AgentIdentity::Certificate {
                                certificate,
                                comment,
                            } => agent_certs.push((certificate, comment)),
                        }
                    }
                    agent = Some(client);
                }
                Err(e) => a
                    .tried
                    .push(format!("ssh-agent at {}: {e}", sock.display())),
            },
            Err(e) => a
                .tried
                .push(format!("ssh-agent at {} unreachable: {e}", sock.display())),
        }
    }
    let mut used_agent_keys: Vec<PublicKey> = Vec::new();
    let mut used_agent_certs: Vec<Certificate> = Vec::new();
    let file_certs = load_certificates(dest, &mut a.tried);

    for path in &dest.identities {
        if !path.exists() {
            if dest.identities_explicit {
                a.tried.push(format!("{} (no such file)", path.display()));
            }
            continue;
        }
        let public = read_public(path);
        let in_agent = public.as_ref().and_then(|p| {
            agent_keys
                .iter()
                .find(|(k, _)| k.key_data() == p.key_data())
                .cloned()
        });
        if let Some(agent) = agent.as_mut() {
            // A certificate the agent holds for this key, as ssh-add loads `<key>-cert.pub`.
            if let Some(p) = &public {
                for (cert, comment) in agent_certs.iter().filter(|(c, _)| certifies(c, p)) {
                    used_agent_certs.push(cert.clone());
                    let label = format!("certificate \"{comment}\" in ssh-agent");
                    if a.with_agent_cert(agent, cert.clone(), label).await? {
                        return Ok(());
                    }
                }
            }
        }
        if let (Some((key, _)), Some(agent)) = (in_agent, agent.as_mut()) {
            used_agent_keys.push(key.clone());
            for c in file_certs.iter().filter(|c| certifies(&c.cert, &key)) {
                let label = format!("{} with {} (via ssh-agent)", c.path, path.display());
                if a.with_file_cert_via_agent(agent, c.cert.clone(), &key, label)
                    .await?
                {
                    return Ok(());
                }
            }
            let label = format!("{} (via ssh-agent)", path.display());
            if a.with_agent(agent, key, label).await? {
                return Ok(());
            }
            continue;
        }
        match load_private(path, Passphrase::for_dest(dest)).await {
            Ok(key) => {
                if let Some(agent_key) = agent_keys
                    .iter()
                    .find(|(k, _)| k.key_data() == key.public_key().key_data())
                {
                    used_agent_keys.push(agent_key.0.clone());
                }
                let key = Arc::new(key);
                for c in file_certs
                    .iter()
                    .filter(|c| certifies(&c.cert, key.public_key()))
                {
                    let label = format!("{} with {}", c.path, path.display());
                    if a.with_cert(key.clone(), c.cert.clone(), label).await? {
                        return Ok(());
                    }
                }
                if a.with_key(key, path.display().to_string()).await? {
                    return Ok(());
                }
            }
            Err(why) => a.tried.push(format!("{} ({why})", path.display())),
        }
    }

    if let Some(agent) = agent.as_mut() {
        if !dest.identities_only {
            for (cert, comment) in agent_certs {
                if used_agent_certs.contains(&cert) {
                    continue;
                }
                let label = format!("certificate \"{comment}\" in ssh-agent");
                if a.with_agent_cert(agent, cert, label).await? {
                    return Ok(());
                }
            }
            for (key, comment) in agent_keys {
                if used_agent_keys
                    .iter()
                    .any(|k| k.key_data() == key.key_data())
                {
                    continue;
                }
                for c in file_certs.iter().filter(|c| certifies(&c.cert, &key)) {
                    let label = format!("{} with ssh-agent key \"{comment}\"", c.path);
                    if a.with_file_cert_via_agent(agent, c.cert.clone(), &key, label)
                        .await?
                    {
                        return Ok(());
                    }
                }
                let label = format!("ssh-agent key \"{comment}\"");
                if a.with_agent(agent, key, label).await? {
                    return Ok(());
                }
            }
        }
    }

    let tried = if a.tried.is_empty() {
        "nothing: no identity file exists and no ssh-agent is available".to_string()
    } else {
        a.tried.join("; ")
    };
    Err(ConnectError::new(
        ConnectStage::Auth,
        format!(
            "permission denied for {}@{}: tried {tried}. Give a key the host accepts with -i \
             or IdentityFile, or load it into ssh-agent",
            dest.user,
            dest.display()
        ),
    ))
}

struct AuthAttempt<'a, H: Handler> {
    handle: &'a mut Handle<H>,
    dest: &'a Destination,
    tried: Vec<String>,
    /// The RSA signature hash the server accepts, asked once.
    rsa_hash: Option<Option<HashAlg>>,
}

impl<H: Handler> AuthAttempt<'_, H> {
    async fn hash_for(&mut self, algorithm: Algorithm) -> Result<Option<HashAlg>, ConnectError> {
        if !algorithm.is_rsa() {
            return Ok(None);
        }
        if let Some(h) = self.rsa_hash {
            return Ok(h);
        }
        let h = match self.handle.best_supported_rsa_hash().await {
            Ok(Some(h)) => h,
            // The server named no signature algorithms: rsa-sha2-256 is what every
            // supported OpenSSH accepts.
            Ok(None) => Some(HashAlg::Sha256),
            Err(e) => return Err(self.lost(e.to_string())),
        };
        self.rsa_hash = Some(h);
        Ok(h)
    }

    fn lost(&self, why: String) -> ConnectError {
        ConnectError::new(
            ConnectStage::Connect,
            format!(
                "connection to {} lost during authentication: {why}",
                self.dest.display()
            ),
        )
    }

    fn timed_out(&self) -> ConnectError {
        ConnectError::new(
            ConnectStage::Connect,
            format!(
                "authentication with {} timed out after {} s (ConnectTimeout)",
                self.dest.display(),
                self.dest.connect_timeout.as_secs_f64()
            ),
        )
    }

    async fn with_key(
        &mut self,
        key: Arc<PrivateKey>,
        label: String,
    ) -> Result<bool, ConnectError> {
        let hash = self.hash_for(key.algorithm()).await?;
        let t = self.dest.connect_timeout;
        let user = self.dest.user.clone();
        let r = tokio::time::timeout(
            t,
            self.handle
                .authenticate_publickey(user, PrivateKeyWithHashAlg::new(key, hash)),
        )
        .await;
        self.outcome(r.map(|r| r.map_err(|e| e.to_string())), label)
    }

    /// A certificate whose private key is loaded here. Signed through a [`LocalKeySigner`]
    /// rather than russh's `authenticate_openssh_cert`, which names an RSA certificate
    /// `ssh-rsa-cert-v01` (SHA-1), refused by OpenSSH since 8.8.
    async fn with_cert(
        &mut self,
        key: Arc<PrivateKey>,
        cert: Certificate,
        label: String,
    ) -> Result<bool, ConnectError> {
        let hash = self.hash_for(cert.algorithm()).await?;
        let t = self.dest.connect_timeout;
        let user = self.dest.user.clone();
        let mut signer = LocalKeySigner { key };
        let r = tokio::time::timeout(
            t,
            self.handle
                .authenticate_certificate_with(user, cert, hash, &mut signer),
        )
        .await;
        self.outcome(r.map(|r| r.map_err(|e| e.0)), label)
    }

    /// A certificate the agent holds itself (it signs for the certificate blob).
    async fn with_agent_cert(
        &mut self,
        agent: &mut Agent,
        cert: Certificate,
        label: String,
    ) -> Result<bool, ConnectError> {
        let hash = self.hash_for(cert.algorithm()).await?;
        let t = self.dest.connect_timeout;
        let user = self.dest.user.clone();
        let r = tokio::time::timeout(
            t,
            self.handle
                .authenticate_certificate_with(user, cert, hash, agent),
        )
        .await;
        self.outcome(r.map(|r| r.map_err(|e| e.to_string())), label)
    }

    /// A certificate from a file whose private key only the agent holds: the agent is
    /// asked to sign with the plain key, which is what a certificate signature is.
    async fn with_file_cert_via_agent(
        &mut self,
        agent: &mut Agent,
        cert: Certificate,
        key: &PublicKey,
        label: String,
    ) -> Result<bool, ConnectError> {
        let hash = self.hash_for(cert.algorithm()).await?;
        let t = self.dest.connect_timeout;
        let user = self.dest.user.clone();
        let mut signer = PlainKeySigner {
            agent,
            key: AgentIdentity::PublicKey {
                key: key.clone(),
                comment: String::new(),
            },
        };
        let r = tokio::time::timeout(
            t,
            self.handle
                .authenticate_certificate_with(user, cert, hash, &mut signer),
        )
        .await;
        self.outcome(r.map(|r| r.map_err(|e| e.0)), label)
    }

    async fn with_agent(
        &mut self,
        agent: &mut Agent,
        key: PublicKey,
        label: String,
    ) -> Result<bool, ConnectError> {
        let hash = self.hash_for(key.algorithm()).await?;
        let t = self.dest.connect_timeout;
        let user = self.dest.user.clone();
        let r = tokio::time::timeout(
            t,
            self.handle
                .authenticate_publickey_with(user, key, hash, agent),
        )
        .await;
        self.outcome(r.map(|r| r.map_err(|e| e.to_string())), label)
    }

    fn outcome(
        &mut self,
        r: Result<Result<AuthResult, String>, tokio::time::error::Elapsed>,
        label: String,
    ) -> Result<bool, ConnectError> {
        match r {
            Err(_) => Err(self.timed_out()),
            Ok(Ok(AuthResult::Success)) => {
                tracing::debug!("authenticated with {label}");
                Ok(true)
            }
            Ok(Ok(AuthResult::Failure { .. })) => {
                if self.handle.is_closed() {
                    return Err(self.lost(format!("the host closed it after refusing {label}")));
                }
                self.tried.push(format!("{label} (refused)"));
                Ok(false)
            }
            Ok(Err(e)) => {
                if self.handle.is_closed() {
                    return Err(self.lost(e));
                }
                self.tried.push(format!("{label} ({e})"));
                Ok(false)
            }
        }
    }
}

/// Signs a certificate authentication with the agent's plain key (the agent was given the
/// key, not the certificate, so it would not recognise the certificate blob).
struct PlainKeySigner<'a> {
    agent: &'a mut Agent,
    key: AgentIdentity,
}

/// Why the agent did not sign; a message only, never key material.
struct SignError(String);

impl From<russh::SendError> for SignError {
    fn from(e: russh::SendError) -> Self {
        SignError(e.to_string())
    }
}

impl russh::Signer for PlainKeySigner<'_> {
    type Error = SignError;

    async fn auth_sign(
        &mut self,
        _certificate: &AgentIdentity,
        hash_alg: Option<HashAlg>,
        to_sign: Vec<u8>,
    ) -> Result<Vec<u8>, SignError> {
        self.agent
            .sign_request(&self.key, hash_alg, to_sign)
            .await
            .map_err(|e| SignError(format!("ssh-agent did not sign: {e}")))
    }
}

/// Signs a certificate authentication with a private key loaded in this process, with
/// the RSA hash the server accepts.
struct LocalKeySigner {
    key: Arc<PrivateKey>,
}

impl russh::Signer for LocalKeySigner {
    type Error = SignError;

    async fn auth_sign(
        &mut self,
        _certificate: &AgentIdentity,
        hash_alg: Option<HashAlg>,
        mut to_sign: Vec<u8>,
    ) -> Result<Vec<u8>, SignError> {
        use russh::keys::signature::Signer as _;
        use russh::keys::ssh_key::encoding::Encode as _;
        use russh::keys::ssh_key::private::KeypairData;
        let signature = match self.key.key_data() {
            KeypairData::Rsa(rsa) => (rsa, hash_alg).try_sign(&to_sign),
            keypair => keypair.try_sign(&to_sign),
        }
        .map_err(|e| SignError(format!("cannot sign with the key: {e}")))?;
        // The request is followed by the signature as one SSH string, as the agent's is.
        signature
            .encode_prefixed(&mut to_sign)
            .map_err(|e| SignError(format!("cannot encode the signature: {e}")))?;
        Ok(to_sign)
    }
}

/// A user certificate from a file, with where it came from.
struct FileCert {
    cert: Certificate,
    path: String,
}

/// True when `cert` certifies `key`.
fn certifies(cert: &Certificate, key: &PublicKey) -> bool {
    cert.public_key() == key.key_data()
}

/// The certificates to offer: every `CertificateFile` (a missing or unreadable one is
/// listed in `tried`, as ssh warns), then `<identity>-cert.pub` beside each identity file.
fn load_certificates(dest: &Destination, tried: &mut Vec<String>) -> Vec<FileCert> {
    let mut out: Vec<FileCert> = Vec::new();
    let mut add = |path: &Path, explicit: bool, tried: &mut Vec<String>| {
        if !path.exists() {
            if explicit {
                tried.push(format!("certificate {} (no such file)", path.display()));
            }
            return;
        }
        match russh::keys::load_openssh_certificate(path) {
            Ok(cert) => {
                if !out.iter().any(|c| c.cert == cert) {
                    out.push(FileCert {
                        cert,
                        path: format!("certificate {}", path.display()),
                    });
                }
            }
            Err(e) => tried.push(format!(
                "certificate {} (not an OpenSSH certificate: {e})",
                path.display()
            )),
        }
    };
    for path in &dest.certificate_files {
        add(path, true, tried);
    }
    for path in &dest.identities {
        let mut cert_path = path.as_os_str().to_owned();
        cert_path.push("-cert.pub");
        add(Path::new(&cert_path), false, tried);
    }
    out
}

/// The public half of an identity, from `PATH.pub`, so that the agent can be matched
/// without decrypting the private key.
fn read_public(path: &Path) -> Option<PublicKey> {
    let mut pub_path = path.as_os_str().to_owned();
    pub_path.push(".pub");
    russh::keys::load_public_key(PathBuf::from(pub_path)).ok()
}

/// Where a passphrase for an encrypted key may come from, decided as OpenSSH's
/// `read_passphrase` does (readpass.c), within opmark's no-prompt rules.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Passphrase {
    /// Nobody may be asked (BatchMode, `opmark mcp`, or no terminal and no askpass).
    Nowhere,
    /// The terminal, with echo off.
    Terminal,
    /// The `SSH_ASKPASS` program.
    Askpass(std::ffi::OsString),
}

impl Passphrase {
    fn for_dest(dest: &Destination) -> Passphrase {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        Passphrase::decide(
            !dest.batch_mode && !NEVER_PROMPT.load(std::sync::atomic::Ordering::Relaxed),
            may_prompt(dest),
            env("SSH_ASKPASS"),
            env("DISPLAY").or_else(|| env("WAYLAND_DISPLAY")).is_some(),
            env("SSH_ASKPASS_REQUIRE")
                .map(|v| v.to_string_lossy().to_ascii_lowercase())
                .unwrap_or_default(),
        )
    }

    /// `askpass` is used when a display is there (or `SSH_ASKPASS_REQUIRE=force`),
    /// `SSH_ASKPASS_REQUIRE` is not `never`, and either no terminal prompt is possible or
    /// `prefer`/`force` asks for it first. Without a program named in `SSH_ASKPASS`
    /// nothing is run: opmark does not guess a default askpass path.
    fn decide(
        anyone: bool,
        terminal: bool,
        askpass: Option<std::ffi::OsString>,
        display: bool,
        require: String,
    ) -> Passphrase {
        if !anyone {
            return Passphrase::Nowhere;
        }
        let allowed = (display || require == "force") && require != "never";
        match askpass {
            Some(program)
                if allowed && (!terminal || require == "prefer" || require == "force") =>
            {
                Passphrase::Askpass(program)
            }
            _ if terminal => Passphrase::Terminal,
            _ => Passphrase::Nowhere,
        }
    }
}

/// Loads a private key; an encrypted one is decrypted with a passphrase from where
/// `from` says. The error says why it is unusable.
async fn load_private(path: &Path, from: Passphrase) -> Result<PrivateKey, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("unreadable: {e}"))?;
    match russh::keys::decode_secret_key(&text, None) {
        Ok(key) => return Ok(key),
        Err(russh::keys::Error::KeyIsEncrypted) => {}
        // PKCS#8 encrypted keys decode as a DER error instead of KeyIsEncrypted (docs/findings.md#russh-key-loading).
        Err(_) if text.contains("ENCRYPTED") => {}
        Err(e) => return Err(format!("not a usable private key: {e}")),
    }
    let shown = path.display().to_string();
    let passphrase = match from {
        Passphrase::Nowhere => {
            return Err(
                "encrypted, not in ssh-agent, and no prompt allowed (stdin is not a \
                terminal and no SSH_ASKPASS with DISPLAY or SSH_ASKPASS_REQUIRE=force, \
                BatchMode is on, or opmark mcp); add it with ssh-add"
                    .to_string(),
            )
        }
        Passphrase::Terminal => tokio::task::spawn_blocking(move || prompt_passphrase(&shown))
            .await
            .ok()
            .flatten()
            .ok_or(
                "encrypted, not in ssh-agent, and no terminal to ask for its passphrase; \
                add it with ssh-add",
            )?,
        Passphrase::Askpass(program) => {
            let shown_program = std::path::PathBuf::from(&program).display().to_string();
            tokio::task::spawn_blocking(move || askpass(&program, &shown))
                .await
                .map_err(|e| format!("SSH_ASKPASS {shown_program} failed: {e}"))?
                .map_err(|why| format!("encrypted; SSH_ASKPASS {shown_program} {why}"))?
        }
    };
    russh::keys::decode_secret_key(&text, Some(&passphrase))
        .map_err(|_| "encrypted, and the passphrase did not decrypt it".to_string())
}

/// Runs the askpass program with the prompt as its argument, as ssh does, and reads the
/// passphrase from its stdout. A non-zero exit is the user cancelling.
fn askpass(program: &std::ffi::OsStr, path: &str) -> Result<String, String> {
    use std::process::{Command, Stdio};
    let out = Command::new(program)
        .arg(format!("Enter passphrase for key '{path}': "))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not be run: {e}"))?;
    if !out.status.success() {
        return Err(format!("gave no passphrase ({})", out.status));
    }
    let text = String::from_utf8(out.stdout)
        .map_err(|_| "printed a passphrase that is not UTF-8".to_string())?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

/// Asks `question` on /dev/tty until the answer is `yes`, `no` or `fingerprint` (which
/// counts as yes), as ssh's host key confirmation does. False without a terminal or at EOF.
pub(crate) fn confirm_on_tty(question: &str, fingerprint: &str) -> bool {
    use std::io::{BufRead, Write};
    // Several hosts connecting at once (a fleet run) ask one at a time, never interleaved.
    static ONE_QUESTION_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_QUESTION_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let Ok(mut tty) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    else {
        return false;
    };
    let Ok(reader) = tty.try_clone() else {
        return false;
    };
    let mut lines = std::io::BufReader::new(reader).lines();
    if write!(tty, "{question}").and_then(|_| tty.flush()).is_err() {
        return false;
    }
    loop {
        let Some(Ok(answer)) = lines.next() else {
            let _ = writeln!(tty);
            return false;
        };
        match answer.trim() {
            a if a.eq_ignore_ascii_case("yes") || a == fingerprint => return true,
            a if a.eq_ignore_ascii_case("no") => return false,
            _ => {
                let _ = write!(tty, "Please type 'yes', 'no' or the fingerprint: ");
                let _ = tty.flush();
            }
        }
    }
}

/// Asks for a passphrase on /dev/tty with echo off. `None` without a controlling terminal.
/// rpassword turns echo off with termios on the terminal itself and turns it back on when
/// the read ends, however it ends (no `stty` processes, none missing, no echo left off).
fn prompt_passphrase(path: &str) -> Option<String> {
    rpassword::prompt_password(format!("Enter passphrase for key '{path}': ")).ok()
}

#[cfg(test)]
mod tests {
    use super::Passphrase::{self, Askpass, Nowhere, Terminal};

    fn decide(anyone: bool, terminal: bool, display: bool, require: &str) -> Passphrase {
        Passphrase::decide(anyone, terminal, Some("ap".into()), display, require.into())
    }

    #[test]
    fn askpass_is_chosen_as_openssh_does() {
        let ap = Askpass("ap".into());
        // No terminal: askpass with a display, or when forced.
        assert_eq!(decide(true, false, true, ""), ap);
        assert_eq!(decide(true, false, false, ""), Nowhere);
        assert_eq!(decide(true, false, false, "force"), ap);
        assert_eq!(decide(true, false, true, "never"), Nowhere);
        // A terminal wins unless askpass is preferred (with a display) or forced.
        assert_eq!(decide(true, true, true, ""), Terminal);
        assert_eq!(decide(true, true, true, "prefer"), ap);
        assert_eq!(decide(true, true, false, "prefer"), Terminal);
        assert_eq!(decide(true, true, false, "force"), ap);
        assert_eq!(decide(true, true, true, "never"), Terminal);
        // BatchMode or opmark mcp: nobody is asked, whatever the environment says.
        assert_eq!(decide(false, true, true, "force"), Nowhere);
        // No SSH_ASKPASS program: nothing to run.
        assert_eq!(
            Passphrase::decide(true, false, None, true, "force".into()),
            Nowhere
        );
    }
}
