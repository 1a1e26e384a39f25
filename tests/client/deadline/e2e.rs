//! End to end over a real hyper server on 127.0.0.1: a client `SetDeadlineLayer` around hyper-util's
//! legacy client, a `ServerDeadlineLayer` around the handler.
//!
//! These run on real time (paused time would auto-advance while the runtime waits for the
//! socket), so they assert bounds that only the passing of time can make true, never a
//! wall-clock duration.

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::deadline::{Deadline, SetDeadlineLayer};
use surely::server::deadline::ServerDeadlineLayer;
use tower::{service_fn, Layer, Service, ServiceExt};

use super::support::{call, secs};

fn header_u64(res: &Response<Incoming>, name: &str) -> u64 {
    res.headers()[name].to_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn the_budget_crosses_the_wire_and_the_handler_inherits_it() {
    let handler = service_fn(|req: Request<Incoming>| async move {
        let inbound: u64 = req.headers()["x-request-timeout-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let current = surely::deadline::current().expect("the handler has a current deadline");
        let extension = req.extensions().get::<Deadline>().copied();
        let left = current.remaining().as_millis() as u64;

        // A client stack called inside the handler, with a generous budget of its own.
        let downstream = service_fn(|r: Request<()>| async move {
            let header = r.headers()["x-request-timeout-ms"].to_str().unwrap();
            Ok::<_, io::Error>(header.parse::<u64>().unwrap())
        });
        let mut client = SetDeadlineLayer::new(secs(60)).layer(downstream);
        let outgoing = client
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap();

        let res = Response::builder()
            .header("x-inbound", inbound)
            .header("x-left-ms", left)
            .header("x-outgoing", outgoing)
            .header(
                "x-extension-is-current",
                (extension == Some(current)).to_string(),
            )
            .body(Full::new(Bytes::new()))
            .unwrap();
        Ok::<_, Infallible>(res)
    });
    let server = ServerDeadlineLayer::builder()
        .max(secs(30))
        .build()
        .unwrap()
        .layer(handler);
    let addr = serve(server).await;

    let transport = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut client = SetDeadlineLayer::new(secs(10)).layer(transport);
    let req = Request::get(format!("http://{addr}/"))
        .body(Empty::new())
        .unwrap();
    let res = call(&mut client, req).await.unwrap();

    assert_eq!(res.status(), StatusCode::OK);
    let inbound = header_u64(&res, "x-inbound");
    let left = header_u64(&res, "x-left-ms");
    let outgoing = header_u64(&res, "x-outgoing");
    // The client sent its 10 s less the 1 ms reserve, less what passed before the call.
    assert!(inbound <= 9_999, "inbound {inbound}");
    assert!(
        inbound >= 5_000,
        "inbound {inbound}: loopback took over 5 s?"
    );
    // The handler's deadline is the inbound budget, never more.
    assert!(left <= inbound, "left {left} > inbound {inbound}");
    // The handler's own client inherited it (its own 60 s lost), less its reserve.
    assert!(
        outgoing < inbound,
        "outgoing {outgoing} >= inbound {inbound}"
    );
    assert!(outgoing <= left, "outgoing {outgoing} > left {left}");
    assert!(outgoing >= 1, "outgoing {outgoing}");
    assert_eq!(res.headers()["x-extension-is-current"], "true");
}

#[tokio::test]
async fn a_budget_below_the_server_minimum_is_refused_over_the_wire() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handler = service_fn(move |_req: Request<Incoming>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ran")))) }
    });
    let server = ServerDeadlineLayer::builder()
        .min(secs(20))
        .max(secs(60))
        .build()
        .unwrap()
        .layer(handler);
    let addr = serve(server).await;

    let transport = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut client = SetDeadlineLayer::new(secs(10)).layer(transport);
    let req = Request::get(format!("http://{addr}/"))
        .body(Empty::new())
        .unwrap();
    let res = call(&mut client, req).await.unwrap();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // The same server runs a request with enough budget.
    let mut client = SetDeadlineLayer::new(secs(30)).layer(client.into_inner());
    let req = Request::get(format!("http://{addr}/"))
        .body(Empty::new())
        .unwrap();
    let res = call(&mut client, req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

use crate::support::serve::serve;
