//! Deadline errors.

use std::fmt;

use crate::classify::DeliveryPhase;

/// The call's deadline refused it before anything was sent, or ended it while in flight.
///
/// Refused calls are classified *rejected, not sent*: nothing happened. A call ended in flight
/// is *maybe committed*: the server may have done the work.
///
/// ```
/// use surely::classify::DeliveryPhase;
/// use surely::deadline::DeadlineExceeded;
///
/// let e = DeadlineExceeded::refused();
/// assert_eq!(e.phase(), DeliveryPhase::NotSent);
/// assert_eq!(e.to_string(), "deadline exceeded: refused before sending, no budget left");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Word-aligned: as a variant of every `surely::Error`, copied with every poll's output, a
// payload that starts at a word boundary is copied in whole words.
#[repr(align(8))]
pub struct DeadlineExceeded {
    phase: DeliveryPhase,
}

impl DeadlineExceeded {
    /// The call was refused before sending: its budget was spent, or too small to use.
    pub fn refused() -> Self {
        DeadlineExceeded {
            phase: DeliveryPhase::NotSent,
        }
    }

    /// The deadline passed while the call was in flight.
    pub fn in_flight() -> Self {
        DeadlineExceeded {
            phase: DeliveryPhase::Sent,
        }
    }

    /// Whether the call was refused before anything was sent.
    pub fn is_refused(&self) -> bool {
        self.phase == DeliveryPhase::NotSent
    }

    /// How far the request got.
    pub fn phase(&self) -> DeliveryPhase {
        self.phase
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_refused() {
            f.write_str("deadline exceeded: refused before sending, no budget left")
        } else {
            f.write_str("deadline exceeded while the call was in flight")
        }
    }
}

impl std::error::Error for DeadlineExceeded {}
