//! The fault layer inside a server's own stack, whose services never fail (an axum `Router` or
//! route, a hyper service whose error is `Infallible`): [`InjectServerFaultLayer`], whose docs
//! say what each fault becomes there. The layer, its service and their body are re-exported at
//! [`fault`](crate::fault).

mod body;
pub mod future;
mod layer;
mod service;

pub use self::body::FaultBody;
pub use self::layer::InjectServerFaultLayer;
pub use self::service::InjectServerFault;
