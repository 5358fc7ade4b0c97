//! A raw JSON-RPC client of `opmark mcp` over its stdio: the opening (initialize, then
//! the initialized notification) written once, for tests that need the wire itself (a
//! signal to the server's pid, exact request ids) rather than the Python SDK.

use std::io::{BufRead as _, BufReader, Lines, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

use serde_json::Value;

/// A running `opmark mcp` that has been initialised.
pub struct McpClient {
    /// The server process (its pid for signals; waited for by [`McpClient::close`]).
    pub server: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl McpClient {
    /// Starts `cmd` (an `opmark ... mcp` command) with piped stdio and opens the session:
    /// `initialize` answered with a result, then `notifications/initialized`.
    pub fn start(mut cmd: Command) -> McpClient {
        let mut server = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("opmark mcp starts");
        let stdin = server.stdin.take();
        let lines = BufReader::new(server.stdout.take().expect("piped stdout")).lines();
        let mut client = McpClient {
            server,
            stdin,
            lines,
            next_id: 1,
        };
        let opened = client.request(
            "initialize",
            serde_json::json!({
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "opmark-test", "version": "0"}}),
        );
        assert!(opened["result"].is_object(), "initialize: {opened}");
        client.send(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        client
    }

    /// Sends one message as one line.
    pub fn send(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().expect("the session is open");
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends `bytes` as they are (a line that may not be JSON at all).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("the session is open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// The next line from the server, as JSON.
    pub fn next_message(&mut self) -> Value {
        let line = self
            .lines
            .next()
            .expect("the server closed stdout")
            .unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Sends request `method` with `params` under the next id; the whole response.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        self.response(id)
    }

    /// Calls tool `name` with `arguments`; the whole response (`result` or `error`).
    pub fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.request(
            "tools/call",
            serde_json::json!({"name": name, "arguments": arguments}),
        )
    }

    /// Calls tool `name`; its result's structured content, which must be an object.
    pub fn structured(&mut self, name: &str, arguments: Value) -> Value {
        let answer = self.call(name, arguments.clone());
        let content = answer["result"]["structuredContent"].clone();
        assert!(content.is_object(), "mcp {name} {arguments}: {answer}");
        content
    }

    /// Lines from the server until the response with `id` (notifications are skipped).
    fn response(&mut self, id: u64) -> Value {
        for line in self.lines.by_ref() {
            let msg: Value = serde_json::from_str(&line.unwrap()).unwrap();
            if msg["id"] == id {
                return msg;
            }
        }
        panic!("the server closed stdout before answering request {id}");
    }

    /// Closes the server's stdin (the end of the session) and waits for it to exit.
    pub fn close(mut self) -> ExitStatus {
        drop(self.stdin.take());
        self.server.wait().expect("opmark mcp is waited for")
    }

    /// Waits for the server without closing its stdin (after a signal), up to `watchdog`:
    /// None if it has not exited by then (it is killed).
    pub fn exited_within(&mut self, watchdog: std::time::Duration) -> Option<ExitStatus> {
        let deadline = std::time::Instant::now() + watchdog;
        loop {
            if let Some(status) = self.server.try_wait().unwrap() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                let _ = self.server.kill();
                let _ = self.server.wait();
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// Runs the MCP client script `tests/mcp/SCRIPT` with `python` (one that imports the
/// official SDK) in `env`'s sealed environment, which its `opmark mcp` server inherits:
/// the opmark binary first, then `args`. The client's JSON report and its stderr; a
/// client that fails, or prints anything but one JSON document, fails the test.
pub fn python_client(
    python: &std::path::Path,
    env: &super::Sealed,
    script: &str,
    args: &[&std::ffi::OsStr],
) -> (Value, String) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp")
        .join(script);
    let sealed = env.opmark();
    let out = Command::new(python)
        .arg(&path)
        .arg(env!("CARGO_BIN_EXE_opmark"))
        .args(args)
        .env_clear()
        .envs(sealed.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .output()
        .unwrap();
    let (stdout, stderr) = (super::text(&out.stdout), super::text(&out.stderr));
    assert!(out.status.success(), "{script} failed: {stdout}\n{stderr}");
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{script}'s report is not JSON ({e}): {stdout}"));
    (report, stderr)
}
