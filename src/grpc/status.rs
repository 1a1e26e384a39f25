//! The call's outcome, read from what tonic hands its caller.

use crate::headers::OUTCOME;
use crate::outcome::metadata;
use crate::{CallOutcome, Error, Outcome};

/// Reads the [`CallOutcome`] the client stack handed back to a tonic caller: from a
/// `tonic::Status`, a `tonic::Response`, or the `Result` of a call; see the
/// [module docs](crate::grpc#what-a-tonic-caller-sees).
///
/// * A `Status` made from the server's error status (a trailers-only response: tonic's
///   answer to every unary error) carries it in its metadata, as the
///   [`surely-outcome`](crate::headers::OUTCOME) value the stack wrote on the response.
///   What comes back is the outcome the stack decided, but for the budget left (to the
///   millisecond) and the key (kept only when it is visible ASCII, as the crate's keys are).
/// * A `Status` made from the stack's own error (a spent deadline, a refused connection, a
///   timed-out attempt) has that error as its `source()`, and the outcome is read from it,
///   exactly: a `surely::Error<tonic::transport::Error>`, the error of the stack around a
///   tonic `Channel`.
/// * A `Response` has the outcome in its extensions, exactly (and in its metadata too).
/// * A `Status` from the trailers of a stream that had started has none: the stack handed
///   the response back when its head arrived, and the status came after. So has a `Status`
///   that no surely client made.
///
/// The stack over [`GrpcTransport`](super::GrpcTransport) (which
/// [`build_channel`](crate::client::ClientBuilder::build_channel) uses) removes the
/// `surely-outcome` key from every response and every trailer it receives before it writes
/// its own, so a server cannot forge the outcome; without it, the key would be the server's
/// word.
///
/// A handler that answers its own caller with a downstream call's `Status` (`?` on the
/// call) passes that status's metadata on, `surely-outcome` included. A caller through the
/// stack still reads its own call's outcome; a caller without it sees the handler's call's
/// outcome, idempotency key included. Where that matters, remove it before answering:
/// `status.metadata_mut().remove("surely-outcome")`.
///
/// ```
/// use surely::grpc::StatusExt;
/// use surely::Outcome;
///
/// fn tell_user(status: &tonic::Status) -> &'static str {
///     match status.outcome() {
///         Outcome::Succeeded => "done",
///         Outcome::Failed => "it did not happen; you may try again",
///         Outcome::Unknown => "it may have happened; we are checking",
///     }
/// }
///
/// // What the stack leaves in the metadata of a final error's `Status`.
/// let mut status = tonic::Status::invalid_argument("no such size");
/// status.metadata_mut().insert("surely-outcome", "failed; attempts=1; stop=final".parse().unwrap());
/// let call = status.call_outcome().unwrap();
/// assert_eq!((call.outcome(), call.attempts()), (Outcome::Failed, 1));
/// assert_eq!(tell_user(&status), "it did not happen; you may try again");
///
/// // A status no surely client made says nothing of the call.
/// assert_eq!(tonic::Status::internal("lost").call_outcome(), None);
/// ```
pub trait StatusExt: sealed::Sealed {
    /// The outcome the client stack handed back, if it did.
    fn call_outcome(&self) -> Option<CallOutcome>;

    /// The call's outcome; [`Unknown`](Outcome::Unknown) when the stack handed none back
    /// (nothing vouches for the call, whatever the status's code).
    fn outcome(&self) -> Outcome {
        self.call_outcome()
            .map_or(Outcome::Unknown, |call| call.outcome())
    }
}

impl StatusExt for tonic::Status {
    fn call_outcome(&self) -> Option<CallOutcome> {
        if let Some(value) = self.metadata().as_ref().get(OUTCOME) {
            return metadata::decode(value.as_bytes());
        }
        // The stack's own error around a `Channel`, which tonic keeps as the source.
        let mut source = std::error::Error::source(self);
        while let Some(err) = source {
            if let Some(err) = err.downcast_ref::<Error<tonic::transport::Error>>() {
                return err.call_outcome().cloned();
            }
            source = err.source();
        }
        None
    }
}

impl<T> StatusExt for tonic::Response<T> {
    fn call_outcome(&self) -> Option<CallOutcome> {
        self.extensions().get::<CallOutcome>().cloned()
    }
}

impl<T> StatusExt for Result<tonic::Response<T>, tonic::Status> {
    fn call_outcome(&self) -> Option<CallOutcome> {
        match self {
            Ok(res) => res.call_outcome(),
            Err(status) => status.call_outcome(),
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tonic::Status {}
    impl<T> Sealed for tonic::Response<T> {}
    impl<T> Sealed for Result<tonic::Response<T>, tonic::Status> {}
}
