//! A TCP proxy on 127.0.0.1 in front of a broker, that a test can hold or cut: what the broker
//! says can be held back (a confirm that does not come), and every connection cut at once (a
//! network failure under the client). It ends with the test's runtime.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy's controls.
pub(crate) struct Proxy {
    addr: SocketAddr,
    held: watch::Sender<bool>,
    cuts: watch::Sender<u64>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`).
    pub(crate) async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (held, _) = watch::channel(false);
        let (cuts, _) = watch::channel(0u64);
        let (held_rx, cuts_rx) = (held.subscribe(), cuts.subscribe());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(broker) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (held, mut cut) = (held_rx.clone(), cuts_rx.clone());
                cut.mark_unchanged();
                tokio::spawn(async move {
                    let (from_client, to_client) = client.into_split();
                    let (from_broker, to_broker) = broker.into_split();
                    tokio::select! {
                        biased;
                        _ = cut.changed() => {}
                        _ = pipe(from_client, to_broker, None) => {}
                        _ = pipe(from_broker, to_client, Some(held)) => {}
                    }
                    // Both sockets close here.
                });
            }
        });
        Proxy { addr, held, cuts }
    }

    /// Where clients connect.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds back (`true`) or lets through what the broker sends to its clients.
    pub(crate) fn hold_replies(&self, held: bool) {
        self.held.send_replace(held);
    }

    /// Closes every connection open now; later ones go through.
    pub(crate) fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

/// Copies `from` to `to` until either closes; waits while `held` says so.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: Option<watch::Receiver<bool>>,
) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(held) = held.as_mut()
            && held.wait_for(|held| !held).await.is_err()
        {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
