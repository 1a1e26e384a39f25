//! The replay layer's error.

/// The error of a copy of a request whose body was not buffered: the body of a
/// [`ReplayBody`](crate::retry::ReplayBody) that could be sent only once, polled again.
///
/// ```
/// use surely::retry::BodyNotReplayable;
///
/// assert_eq!(
///     BodyNotReplayable.to_string(),
///     "request body was not buffered (too large, or it failed while being read), so it cannot be sent again",
/// );
/// ```
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("request body was not buffered (too large, or it failed while being read), so it cannot be sent again")]
#[non_exhaustive]
pub struct BodyNotReplayable;
