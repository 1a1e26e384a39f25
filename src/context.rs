//! The task-local call context: what outer layers tell inner ones without touching the request.
//!
//! A client deadline layer, a call record layer and the server deadline layer scope a
//! [`Context`] around their inner service's `call` and every poll of its future. Inner layers and
//! client stacks called inside a server handler read it. Being task-local, it costs no allocation
//! and needs no request extensions, so it works for any request type.

use crate::deadline::Deadline;
use crate::record::CallId;

tokio::task_local! {
    static CONTEXT: Context;
}

/// What is known about the call being made on this task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Context {
    /// The call's deadline.
    pub(crate) deadline: Option<Deadline>,
    /// The logical call this attempt belongs to.
    pub(crate) call: Option<CallId>,
}

impl Context {
    /// The context of the current task, or the empty one.
    pub(crate) fn current() -> Context {
        CONTEXT.try_with(|c| *c).unwrap_or_default()
    }

    /// Runs `f` with this context as the current one.
    pub(crate) fn scope<R>(self, f: impl FnOnce() -> R) -> R {
        CONTEXT.sync_scope(self, f)
    }
}
