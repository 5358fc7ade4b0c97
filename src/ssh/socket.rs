//! The client's TCP socket, tuned so that no exchange waits on a delayed ACK: Nagle off
//! (`TCP_NODELAY`) and `TCP_QUICKACK` re-armed after every read.
//!
//! sshd writes some answers as two small packets back to back with Nagle on (the channel
//! open confirmation and its window adjust; the exit status and the close). Nagle holds
//! the second until the first is acknowledged, and a Linux client delays that ACK by up to
//! 40 ms, so each such answer costs ~40 ms on any network (docs/findings.md#nagle-and-delayed-acks). `TCP_QUICKACK` makes
//! the kernel acknowledge at once, but Linux clears it again on its own (when it decides
//! the connection is interactive), so it is set again after each read that got bytes.
//! Only a real TCP socket is tuned: a hop reached through a jump host's channel is a
//! stream inside the jump's connection, whose own socket is tuned.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A connected TCP stream with Nagle off that re-arms `TCP_QUICKACK` after each read.
#[derive(Debug)]
pub(crate) struct TunedStream {
    inner: TcpStream,
    /// Cleared after the first failed setsockopt, so a socket that refuses it (not TCP
    /// after all, or a kernel without it) costs one warning, not one per read.
    quickack: bool,
}

impl TunedStream {
    pub(crate) fn new(inner: TcpStream) -> TunedStream {
        if let Err(e) = inner.set_nodelay(true) {
            tracing::warn!("cannot turn Nagle off on the SSH socket (TCP_NODELAY): {e}");
        }
        let mut tuned = TunedStream {
            inner,
            quickack: true,
        };
        tuned.rearm_quickack();
        tuned
    }

    fn rearm_quickack(&mut self) {
        if !self.quickack {
            return;
        }
        if let Err(e) = set_quickack(&self.inner) {
            tracing::debug!("TCP_QUICKACK not available on the SSH socket: {e}");
            self.quickack = false;
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn set_quickack(stream: &TcpStream) -> io::Result<()> {
    rustix::net::sockopt::set_tcp_quickack(stream, true).map_err(io::Error::from)
}

/// Only Linux has the delayed-ACK switch; elsewhere Nagle off is all there is.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn set_quickack(_: &TcpStream) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "TCP_QUICKACK is Linux only",
    ))
}

impl AsyncRead for TunedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.rearm_quickack();
        }
        polled
    }
}

impl AsyncWrite for TunedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn quickack_is_set_again_after_each_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let mut tuned = TunedStream::new(client.unwrap());
        let (mut server, _) = server.unwrap();
        assert!(tuned.inner.nodelay().unwrap());
        for round in 0..3 {
            // Clear it as the kernel may, then prove a read sets it again.
            rustix::net::sockopt::set_tcp_quickack(&tuned.inner, false).unwrap();
            server.write_all(b"x").await.unwrap();
            let mut byte = [0u8; 1];
            tuned.read_exact(&mut byte).await.unwrap();
            assert!(
                rustix::net::sockopt::tcp_quickack(&tuned.inner).unwrap(),
                "round {round}: TCP_QUICKACK not re-armed after a read"
            );
        }
    }
}
