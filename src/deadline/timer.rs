//! How a deadline layer ends a call that is still waiting at its deadline.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

/// How a [`SetDeadlineLayer`](super::SetDeadlineLayer) ends a call that is still waiting at its
/// deadline. Sealed: [`OwnTimer`] and [`AttemptTimers`] are the two ways.
///
/// Both arm no timer for a call that answers on its first poll, and none while an
/// [`AttemptTimeout`](crate::timeout::AttemptTimeout) inside already ends the attempt by the
/// deadline. They differ in where the timer lives when one is needed:
///
/// * [`OwnTimer`] (the default) keeps it inside the call's future: never an allocation, but a
///   future about 110 bytes larger, which every layer outside moves around;
/// * [`AttemptTimers`] counts on an attempt timeout inside (as in the canonical stack, where
///   one always is: [layer order](crate::docs::architecture#layer-order)) and keeps only a
///   pointer: when no layer inside ends the call by the deadline after all, it boxes a timer,
///   one allocation for that call.
pub trait Enforcement: sealed::Timer {}

/// The deadline layer keeps a timer of its own inside each call's future (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct OwnTimer;

/// The deadline layer counts on an [`AttemptTimeoutLayer`](crate::timeout::AttemptTimeoutLayer)
/// inside to end each attempt by the deadline, and boxes a timer only for a call where none does.
///
/// ```
/// use std::time::Duration;
/// use surely::deadline::SetDeadlineLayer;
/// use surely::timeout::AttemptTimeoutLayer;
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let hangs = service_fn(|_req: http::Request<()>| async {
///     std::future::pending::<()>().await;
///     Ok::<_, std::io::Error>(())
/// });
/// let mut client = ServiceBuilder::new()
///     .layer(
///         SetDeadlineLayer::builder()
///             .timeout(Duration::from_secs(2))
///             .enforce_in_attempts()
///             .build()
///             .unwrap(),
///     )
///     .layer(AttemptTimeoutLayer::new(Duration::from_secs(5)))
///     .service(hangs);
///
/// let err = client.ready().await.unwrap().call(http::Request::new(())).await.unwrap_err();
/// // The attempt timeout ended the attempt at the call's deadline, with one timer.
/// assert!(err.elapsed().is_some_and(|e| e.is_deadline()));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct AttemptTimers;

impl Enforcement for OwnTimer {}
impl Enforcement for AttemptTimers {}

pub(crate) mod sealed {
    use super::*;

    /// Where the timer lives.
    #[allow(unreachable_pub)]
    pub trait Timer {
        /// The timer's slot in the call's future.
        type Slot: Default;

        /// Whether the timer is armed.
        fn is_armed(slot: &Self::Slot) -> bool;

        /// Arms the timer for `at`.
        fn arm(slot: Pin<&mut Self::Slot>, at: Instant);

        /// Polls an armed timer; `Pending` if unarmed.
        fn poll(slot: Pin<&mut Self::Slot>, cx: &mut Context<'_>) -> Poll<()>;
    }

    impl Timer for OwnTimer {
        type Slot = Option<Sleep>;

        fn is_armed(slot: &Self::Slot) -> bool {
            slot.is_some()
        }

        fn arm(mut slot: Pin<&mut Self::Slot>, at: Instant) {
            slot.set(Some(tokio::time::sleep_until(at)));
        }

        fn poll(slot: Pin<&mut Self::Slot>, cx: &mut Context<'_>) -> Poll<()> {
            match slot.as_pin_mut() {
                Some(sleep) => sleep.poll(cx),
                None => Poll::Pending,
            }
        }
    }

    impl Timer for AttemptTimers {
        type Slot = Option<Pin<Box<Sleep>>>;

        fn is_armed(slot: &Self::Slot) -> bool {
            slot.is_some()
        }

        fn arm(mut slot: Pin<&mut Self::Slot>, at: Instant) {
            slot.set(Some(Box::pin(tokio::time::sleep_until(at))));
        }

        fn poll(slot: Pin<&mut Self::Slot>, cx: &mut Context<'_>) -> Poll<()> {
            match Pin::get_mut(slot) {
                Some(sleep) => sleep.as_mut().poll(cx),
                None => Poll::Pending,
            }
        }
    }
}
