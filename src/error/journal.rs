//! The intent journal's error.

use std::fmt;

use crate::classify::{AttemptClass, Classification, DeliveryPhase};

/// The [intent journal](crate::journal) could not write a call's intent before its first
/// attempt, so the call was not sent: a journaled call goes out only once its intent is durable.
///
/// Classified [`Rejected`](AttemptClass::Rejected) at [`NotSent`](DeliveryPhase::NotSent):
/// nothing happened downstream, and the caller may try the call again.
///
/// ```
/// use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
/// use surely::journal::JournalError;
///
/// let err = JournalError::new("connection refused");
/// assert_eq!(err.to_string(), "the call's intent could not be journaled, so it was not sent: connection refused");
/// let c = err.classify_error(DeliveryPhase::Sent);
/// assert_eq!((c.class(), c.phase()), (AttemptClass::Rejected, DeliveryPhase::NotSent));
/// ```
pub struct JournalError {
    // Boxed: it is a variant of every `surely::Error`, which every layer moves.
    inner: Box<Inner>,
}

struct Inner {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl JournalError {
    /// An error that says why.
    pub fn new(why: impl Into<String>) -> Self {
        JournalError {
            inner: Box::new(Inner {
                message: why.into(),
                source: None,
            }),
        }
    }

    /// An error caused by the journal's backend: its message says that the backend failed, and
    /// the backend's error is its [`source`](std::error::Error::source), not repeated in the
    /// message.
    ///
    /// ```
    /// use std::error::Error as _;
    /// use surely::journal::JournalError;
    ///
    /// let err = JournalError::backend("connection refused");
    /// assert_eq!(err.message(), "the journal's backend failed");
    /// assert!(!err.to_string().contains("connection refused"));
    /// assert_eq!(err.source().unwrap().to_string(), "connection refused");
    /// ```
    pub fn backend(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        JournalError {
            inner: Box::new(Inner {
                message: String::from("the journal's backend failed"),
                source: Some(error.into()),
            }),
        }
    }

    /// Why the intent was not written.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    pub(crate) fn classification(&self) -> Classification {
        Classification::new(AttemptClass::Rejected, DeliveryPhase::NotSent)
    }
}

impl fmt::Debug for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalError")
            .field("message", &self.inner.message)
            .finish()
    }
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the call's intent could not be journaled, so it was not sent: {}",
            self.inner.message
        )
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl crate::classify::ClassifyError for JournalError {
    fn classify_error(&self, _phase: DeliveryPhase) -> Classification {
        self.classification()
    }
}
