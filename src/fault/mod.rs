//! Fault injection (temporary placeholder while the module is written; replaced by the full module).
use crate::classify::DeliveryPhase;
/// An injected fault.
#[derive(Clone, Debug, thiserror::Error)]
#[error("injected fault")]
pub struct InjectedFault {
    phase: DeliveryPhase,
}
impl InjectedFault {
    /// The phase.
    pub fn phase(&self) -> DeliveryPhase {
        self.phase
    }
}
