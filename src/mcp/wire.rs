//! The stdio line discipline in front of rmcp: every line a client sends is checked
//! before the SDK sees it, because the SDK drops a line it cannot parse without a word,
//! and a client then waits for an answer that never comes. A line that is not JSON gets
//! JSON-RPC's parse error (-32700), one that is JSON but not a JSON-RPC message gets
//! -32600, and one longer than [`MAX_LINE`] is skipped to its end (never held whole)
//! and answered -32600 naming the limit. The server stays up for the next line.
//!
//! The SDK reads and writes one end of an in-process pipe; this module copies the
//! client's lines into it and the SDK's lines out to stdout, whole lines only, so its own
//! error lines never split one of the SDK's.

use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

/// The longest line (one JSON-RPC message) accepted: a `run` carries its stdin inline,
/// so a message may be large, but not without bound.
pub const MAX_LINE: usize = 32 << 20;

/// [`line_checked`] on this process's stdin and stdout: the JSON-RPC wire, whose write
/// errors end the session (the client is gone), never a panic.
pub fn stdio(
    tasks: super::tasks::Tasks,
) -> (
    (
        tokio::io::ReadHalf<tokio::io::DuplexStream>,
        tokio::io::WriteHalf<tokio::io::DuplexStream>,
    ),
    tokio::task::JoinHandle<()>,
) {
    line_checked(tokio::io::stdin(), tokio::io::stdout(), Some(tasks))
}

/// The pipe the SDK serves on, and the tasks that feed it from `input` and copy its
/// answers to `output`. The tasks end when `input` ends (the SDK then sees the end of
/// its input) and when the SDK closes its side.
pub fn line_checked<I, O>(
    input: I,
    output: O,
    tasks: Option<super::tasks::Tasks>,
) -> (
    (
        tokio::io::ReadHalf<tokio::io::DuplexStream>,
        tokio::io::WriteHalf<tokio::io::DuplexStream>,
    ),
    tokio::task::JoinHandle<()>,
)
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin + Send + 'static,
{
    let (sdk_side, our_side) = tokio::io::duplex(1 << 16);
    let (from_sdk, mut to_sdk) = tokio::io::split(our_side);
    let output = Arc::new(Mutex::new(output));
    let out = Arc::clone(&output);
    let advertise = tasks.is_some();
    let feed = tokio::spawn(async move {
        let mut input = BufReader::with_capacity(1 << 16, input);
        // A session whose `initialize` declared the tasks extension gets the SDK's.
        let mut extension_session = false;
        loop {
            match read_line(&mut input).await {
                Line::End => break,
                Line::Whole(line) => match check(&line) {
                    Ok(()) => {
                        if let Some(tasks) = &tasks {
                            let message = serde_json::from_slice::<Value>(&line).ok();
                            if let Some(m) = &message {
                                if m.get("method").and_then(Value::as_str) == Some("initialize") {
                                    extension_session = m
                                        .pointer("/params/capabilities")
                                        .is_some_and(super::tasks::declares_extension);
                                }
                            }
                            if let Some(message) = message
                                .filter(|m| super::tasks::Tasks::handles(m, extension_session))
                            {
                                answer_task(tasks.clone(), message, Arc::clone(&out));
                                continue;
                            }
                        }
                        if to_sdk.write_all(&line).await.is_err() {
                            break;
                        }
                    }
                    Err(answer) => {
                        if write_line(&out, &answer).await.is_err() {
                            break;
                        }
                    }
                },
                Line::TooLong(len) => {
                    let answer = error_line(
                        -32600,
                        &format!(
                            "Invalid Request: a message of {len} bytes or more is over opmark's limit of {} MiB per line; nothing was done. Send less in one message (a large stdin belongs in a file on the host)",
                            MAX_LINE >> 20
                        ),
                    );
                    if write_line(&out, &answer).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_sdk.shutdown().await;
    });
    let copy = tokio::spawn(async move {
        let mut from_sdk = BufReader::with_capacity(1 << 16, from_sdk);
        let mut line = Vec::new();
        loop {
            line.clear();
            match from_sdk.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    // The initialize answer says which task methods are served here.
                    let line = match &advertise {
                        true => super::tasks::advertise(&line).unwrap_or(line.clone()),
                        false => line.clone(),
                    };
                    if write_line(&output, &line).await.is_err() {
                        break;
                    }
                }
            }
        }
        feed.abort();
    });
    (tokio::io::split(sdk_side), copy)
}

/// Answers a task message on a thread of its own: the operations block, and a
/// `tasks/result` waits for the command's end while other messages are served.
fn answer_task<O>(tasks: super::tasks::Tasks, message: Value, out: Arc<Mutex<O>>)
where
    O: AsyncWrite + Unpin + Send + 'static,
{
    let runtime = tokio::runtime::Handle::current();
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let (on_thread, runtime_here) = (Arc::clone(&out), runtime.clone());
    let spawned = std::thread::Builder::new()
        .name("opmark-mcp-tasks".into())
        .spawn(move || {
            let line = tasks.answer(&message);
            runtime.spawn(async move {
                let _ = write_line(&on_thread, &line).await;
            });
        });
    if let Err(e) = spawned {
        let mut line = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603,
            "message": format!("cannot start a thread for the task message: {e}; nothing was done")}})
        .to_string()
        .into_bytes();
        line.push(b'\n');
        runtime_here.spawn(async move {
            let _ = write_line(&out, &line).await;
        });
    }
}

enum Line {
    /// A line with its newline (or the last one, without).
    Whole(Vec<u8>),
    /// A line this long or longer, skipped to its end.
    TooLong(usize),
    /// The input ended.
    End,
}

/// The next line of `input`, never holding more than [`MAX_LINE`] bytes of it.
async fn read_line<R: AsyncRead + Unpin>(input: &mut BufReader<R>) -> Line {
    let mut line = Vec::new();
    let mut skipped = 0usize;
    loop {
        let buf = match input.fill_buf().await {
            Ok(buf) => buf,
            Err(_) => return Line::End,
        };
        if buf.is_empty() {
            return match (line.is_empty(), skipped) {
                (true, 0) => Line::End,
                (_, 0) => Line::Whole(line),
                (_, n) => Line::TooLong(n),
            };
        }
        let (take, ended) = match buf.iter().position(|&b| b == b'\n') {
            Some(nl) => (nl + 1, true),
            None => (buf.len(), false),
        };
        if skipped > 0 || line.len() + take > MAX_LINE {
            skipped += line.len() + take;
            line = Vec::new();
        } else {
            line.extend_from_slice(&buf[..take]);
        }
        input.consume(take);
        if ended {
            return if skipped > 0 {
                Line::TooLong(skipped)
            } else {
                Line::Whole(line)
            };
        }
    }
}

/// Ok for a line the SDK should see (a JSON-RPC message, or a blank line it ignores);
/// otherwise the error line to answer.
fn check(line: &[u8]) -> Result<(), Vec<u8>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(e) => {
            return Err(error_line(
                -32700,
                &format!("Parse error: the line is not JSON ({e}); nothing was done"),
            ))
        }
    };
    let is_message = |v: &Value| {
        v.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
            && (v.get("method").is_some_and(Value::is_string)
                || v.get("result").is_some()
                || v.get("error").is_some())
    };
    let ok = match &value {
        Value::Object(_) => is_message(&value),
        Value::Array(batch) => !batch.is_empty() && batch.iter().all(is_message),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let id = value.get("id").cloned().unwrap_or(Value::Null);
    let mut answer = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32600, "message": "Invalid Request: not a JSON-RPC 2.0 message (an object with \"jsonrpc\": \"2.0\" and a \"method\"); nothing was done"},
    })
    .to_string()
    .into_bytes();
    answer.push(b'\n');
    Err(answer)
}

/// A JSON-RPC error response for a message whose id could not be read.
fn error_line(code: i64, message: &str) -> Vec<u8> {
    let mut line = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": code, "message": message},
    })
    .to_string()
    .into_bytes();
    line.push(b'\n');
    line
}

async fn write_line<O: AsyncWrite + Unpin>(out: &Mutex<O>, line: &[u8]) -> std::io::Result<()> {
    let mut out = out.lock().await;
    out.write_all(line).await?;
    out.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(line: &str) -> Value {
        let answer = check(line.as_bytes()).expect_err("accepted");
        serde_json::from_slice(&answer).unwrap()
    }

    #[test]
    fn a_line_that_is_not_json_is_a_parse_error_with_a_null_id() {
        let a = answered("this is not json\n");
        assert_eq!(a["error"]["code"], -32700);
        assert_eq!(a["id"], Value::Null);
        assert!(a["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing was done"));
    }

    #[test]
    fn json_that_is_not_a_message_is_an_invalid_request_keeping_its_id() {
        let a = answered(r#"{"id": 7, "params": {}}"#);
        assert_eq!(
            (a["error"]["code"].clone(), a["id"].clone()),
            ((-32600).into(), 7.into())
        );
        assert_eq!(answered("[]")["error"]["code"], -32600);
        assert_eq!(answered("42")["error"]["code"], -32600);
    }

    #[test]
    fn messages_and_blank_lines_pass() {
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            "\n",
        ] {
            assert!(check(line.as_bytes()).is_ok(), "{line}");
        }
    }

    #[tokio::test]
    async fn an_oversized_line_is_skipped_whole_and_the_next_one_read() {
        let mut input = vec![b'x'; MAX_LINE + 10];
        input.push(b'\n');
        input.extend_from_slice(b"{\"next\":1}\n");
        let mut reader = BufReader::new(&input[..]);
        assert!(matches!(read_line(&mut reader).await, Line::TooLong(n) if n == MAX_LINE + 11));
        assert!(matches!(read_line(&mut reader).await, Line::Whole(l) if l == b"{\"next\":1}\n"));
        assert!(matches!(read_line(&mut reader).await, Line::End));
    }
}
