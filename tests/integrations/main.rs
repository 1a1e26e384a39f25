//! The crate with other libraries: the gRPC stack over tonic, the decision matrix over reqwest,
//! the stack as a reqwest-middleware `Middleware`, and the OpenTelemetry recorder.

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod grpc;
mod otel;
mod reqwest;
mod reqwest_middleware;
