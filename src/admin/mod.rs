//! The operator's surface: see and settle what the system could not
//! ([`docs::operators`](crate::docs::operators)).

mod audit;

#[cfg(feature = "postgres")]
pub(crate) use self::audit::POSTGRES_COMPONENT;
pub use self::audit::{AuditAction, AuditError, AuditLog, AuditRecord};
