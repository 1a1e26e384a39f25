//! Names no other test, binary or run uses: for tables, schemas and streams on the machine's
//! shared servers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// `<process id>_<a counter of this process>_<the clock's nanoseconds>`.
pub(crate) fn suffix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// `<prefix>_<suffix>`.
pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", suffix())
}
