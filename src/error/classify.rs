//! Classifying a boxed error: the chain of `source()`s is walked for an error the crate knows,
//! its own layers' (which live in this module), an invalid key, or a transport's.

use std::io;

use crate::classify::{
    AttemptClass, BoxError, Cause, Classification, ClassifyError, DeliveryPhase,
};

impl ClassifyError for BoxError {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        classify_dyn(&**self, phase)
    }
}

/// Walks the `source()` chain for an error the crate knows.
pub(crate) fn classify_dyn(
    error: &(dyn std::error::Error + 'static),
    phase: DeliveryPhase,
) -> Classification {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(c) = classify_known(e, phase) {
            return c;
        }
        next = e.source();
    }
    Classification::failure_at(phase).with_cause(cause_in(error))
}

/// What ended an attempt, as the first error along `error`'s `source()` chain that says:
/// an I/O error's kind (or the error it wraps), a timeout or a connection closed early in
/// hyper's words.
pub(crate) fn cause_in(error: &(dyn std::error::Error + 'static)) -> Option<Cause> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(e) = e.downcast_ref::<io::Error>() {
            let wrapped = e.get_ref().and_then(|inner| cause_in(inner));
            if let Some(cause) = wrapped.or_else(|| Cause::of_io_kind(e.kind())) {
                return Some(cause);
            }
        }
        #[cfg(feature = "hyper")]
        if let Some(e) = e.downcast_ref::<hyper::Error>() {
            if e.is_timeout() {
                return Some(Cause::TimedOut);
            }
            if e.is_incomplete_message() {
                return Some(Cause::Closed);
            }
        }
        next = e.source();
    }
    None
}

fn classify_known(
    e: &(dyn std::error::Error + 'static),
    phase: DeliveryPhase,
) -> Option<Classification> {
    if let Some(e) = e.downcast_ref::<io::Error>() {
        // `io::Error::source` skips the error it wraps; look at it first.
        let wrapped = e.get_ref().and_then(|inner| classify_known(inner, phase));
        return Some(wrapped.unwrap_or_else(|| e.classify_error(phase)));
    }
    if let Some(c) = classify_surely_error(e, phase) {
        return Some(c);
    }
    if let Some(e) = e.downcast_ref::<super::DeadlineExceeded>() {
        return Some(Classification::failure_at(e.phase()));
    }
    if let Some(e) = e.downcast_ref::<super::Elapsed>() {
        return Some(Classification::failure_at(e.phase()));
    }
    if let Some(e) = e.downcast_ref::<super::BodyIdle>() {
        return Some(e.classify_error(phase));
    }
    if let Some(e) = e.downcast_ref::<super::InjectedFault>() {
        return Some(Classification::failure_at(e.phase()));
    }
    if let Some(e) = e.downcast_ref::<super::CircuitOpen>() {
        return Some(e.classification());
    }
    if e.is::<crate::ids::InvalidKey>() {
        return Some(Classification::new(
            AttemptClass::Final,
            DeliveryPhase::NotSent,
        ));
    }
    #[cfg(feature = "tonic")]
    {
        if e.is::<tonic::ConnectError>() {
            return Some(
                Classification::failure_at(DeliveryPhase::NotSent).with_cause(cause_in(e)),
            );
        }
        if let Some(e) = e.downcast_ref::<tonic::transport::Error>() {
            return Some(e.classify_error(phase));
        }
    }
    #[cfg(feature = "http2")]
    {
        // RFC 9113 §8.7: a stream reset with REFUSED_STREAM was not processed, and "can be
        // safely retried"; any other HTTP/2 error says nothing about the work.
        if let Some(e) = e.downcast_ref::<h2::Error>()
            && e.reason() == Some(h2::Reason::REFUSED_STREAM)
        {
            return Some(Classification::new(
                AttemptClass::Rejected,
                DeliveryPhase::Sent,
            ));
        }
    }
    #[cfg(feature = "reqwest")]
    if let Some(e) = e.downcast_ref::<::reqwest::Error>() {
        return Some(e.classify_error(phase));
    }
    #[cfg(feature = "hyper")]
    {
        if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            return Some(e.classify_error(phase));
        }
        if let Some(e) = e.downcast_ref::<hyper::Error>() {
            return Some(e.classify_error(phase));
        }
    }
    None
}

/// A boxed [`crate::Error`] of one of the known transports: its local errors carry the phase.
fn classify_surely_error(
    e: &(dyn std::error::Error + 'static),
    phase: DeliveryPhase,
) -> Option<Classification> {
    macro_rules! try_transports {
        ($($(#[$m:meta])* $t:ty),* $(,)?) => {$(
            $(#[$m])*
            if let Some(e) = e.downcast_ref::<crate::Error<$t>>() {
                return Some(e.classify_error(phase));
            }
        )*};
    }
    try_transports!(
        io::Error,
        crate::error::BoxedError,
        http::Error,
        #[cfg(feature = "hyper")]
        hyper::Error,
        #[cfg(feature = "hyper")]
        hyper_util::client::legacy::Error,
        #[cfg(feature = "tonic")]
        tonic::transport::Error,
        #[cfg(feature = "reqwest")]
        ::reqwest::Error,
    );
    None
}

/// hyper-util's client error: `is_connect()` is evidence that nothing was sent.
#[cfg(feature = "hyper")]
impl ClassifyError for hyper_util::client::legacy::Error {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        if self.is_connect() {
            return Classification::failure_at(DeliveryPhase::NotSent).with_cause(cause_in(self));
        }
        match std::error::Error::source(self) {
            Some(source) => classify_dyn(source, phase),
            None => Classification::failure_at(phase),
        }
    }
}

/// tonic's transport error (a `Channel`'s): classified by what it wraps. A failed connection
/// (tonic's `ConnectError`, anywhere along the `source()` chain) is evidence that nothing was
/// sent, whatever the cause (refused, unreachable, timed out while connecting); an error of hyper
/// or of I/O inside is classified as such; anything else by phase.
#[cfg(feature = "tonic")]
impl ClassifyError for tonic::transport::Error {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        match std::error::Error::source(self) {
            Some(source) => classify_dyn(source, phase),
            None => Classification::failure_at(phase),
        }
    }
}

/// hyper's error: a request hyper reports as canceled was never written (the connection closed
/// first); an I/O error inside is classified by kind; anything else by phase.
#[cfg(feature = "hyper")]
impl ClassifyError for hyper::Error {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        if self.is_canceled() {
            return Classification::failure_at(DeliveryPhase::NotSent);
        }
        match std::error::Error::source(self) {
            Some(source) => classify_dyn(source, phase),
            None => Classification::failure_at(phase).with_cause(cause_in(self)),
        }
    }
}
