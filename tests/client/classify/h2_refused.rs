//! HTTP/2's REFUSED_STREAM over a real connection on 127.0.0.1: the server refused the stream
//! before any processing (RFC 9113 §8.7), so even a POST without a key may be sent again.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
use tokio::net::TcpListener;

/// A raw HTTP/2 server that refuses every stream, counting them.
async fn refusing_server() -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, streams) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((_req, mut respond))) = conn.accept().await {
                    let _ = seen.send(());
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    (addr, streams)
}

#[tokio::test]
async fn a_refused_stream_is_rejected_not_processed() {
    let (addr, mut streams) = refusing_server().await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let post = http::Request::post(format!("http://{addr}/orders"))
        .body(Full::new(Bytes::from_static(b"o-1")))
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), client.request(post))
        .await
        .expect("bounded")
        .unwrap_err();
    let c = err.classify_error(DeliveryPhase::Sent);
    assert_eq!(c.class(), AttemptClass::Rejected, "{err:?}");
    assert!(c.is_retryable(surely::Semantics::NonIdempotent));
    assert!(streams.try_recv().is_ok(), "the stream reached the server");
}

#[test]
fn other_http2_errors_say_nothing_about_the_work() {
    let reset: surely::classify::BoxError = Box::new(h2::Error::from(h2::Reason::INTERNAL_ERROR));
    assert_eq!(
        reset.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::MaybeCommitted
    );
    let refused: surely::classify::BoxError = Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM));
    assert_eq!(
        refused.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::Rejected
    );
}
