//! The TCP proxy between the client and the order service, where replies get lost: armed, it
//! reads the order service's next replies and closes both sides instead of passing them on.
//! The request was served; its caller never hears.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::BoxError;

/// How long the proxy waits for the order service to accept.
const CONNECT: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(crate) struct Drops {
    /// Replies still to drop.
    armed: AtomicU32,
    /// Replies dropped so far.
    pub(crate) dropped: AtomicU64,
}

impl Drops {
    /// Drops the next `n` replies.
    pub(crate) fn arm(&self, n: u32) {
        self.armed.store(n, Ordering::SeqCst);
    }

    /// Replies still to drop.
    pub(crate) fn left(&self) -> u32 {
        self.armed.load(Ordering::SeqCst)
    }

    pub(crate) fn disarm(&self) {
        self.armed.store(0, Ordering::SeqCst);
    }

    /// Takes one armed drop, if any.
    fn take(&self) -> bool {
        self.armed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Listens on a free port of 127.0.0.1 and forwards each connection to `upstream`; returns
/// the port's address. The listener ends with the driver's runtime.
pub(crate) async fn start(upstream: SocketAddr, drops: Arc<Drops>) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(forward(client, upstream, drops.clone()));
        }
    });
    Ok(addr)
}

async fn forward(client: TcpStream, upstream: SocketAddr, drops: Arc<Drops>) {
    let server = match tokio::time::timeout(CONNECT, TcpStream::connect(upstream)).await {
        Ok(Ok(server)) => server,
        // The order service is down: the client's connection is closed, as a load balancer
        // with no backend would.
        _ => return,
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    };
    let replies = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if drops.take() {
                drops.dropped.fetch_add(1, Ordering::SeqCst);
                // Read and thrown away: both sides closed.
                return;
            }
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    // A dropped reply ends both directions: the client sees its connection close.
    tokio::select! {
        () = replies => {}
        () = async { requests.await; std::future::pending::<()>().await } => {}
    }
}
