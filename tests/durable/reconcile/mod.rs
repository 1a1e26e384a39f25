//! Cross-system reconciliation: sources merged by key, rules, differences as durable items
//! with a deterministic repair id, and repairs applied once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use surely::reconcile::{
    DifferenceStore, MemorySource, Reconciler, RepairAnswer, RepairId, RepairRequest, Rule, Want,
};

pub(crate) use crate::support::time::secs;

mod memory;
#[cfg(feature = "postgres")]
mod postgres;

/// The grace window of the rules below.
pub(crate) const GRACE: Duration = Duration::from_secs(300);

/// A fixed "now" for the comparisons: facts are placed before or after it.
pub(crate) fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// `n` seconds before [`now`].
pub(crate) fn ago(n: u64) -> SystemTime {
    now() - Duration::from_secs(n)
}

/// The three systems of the seed's story, each a memory source.
#[derive(Clone, Default)]
pub(crate) struct Systems {
    pub(crate) orders: MemorySource,
    pub(crate) payments: MemorySource,
    pub(crate) inventory: MemorySource,
}

/// The rules over [`Systems`]: a charge needs a paid order; inventory follows the order.
pub(crate) fn rules() -> Vec<Rule> {
    vec![
        Rule::new("payment-order", ["orders", "payments"])
            .grace(GRACE)
            .consistent([Want::is("paid"), Want::is("charged")])
            .consistent([Want::is("awaiting_payment"), Want::Missing])
            .consistent([Want::Any, Want::Missing])
            .repair(
                [Want::is("awaiting_payment"), Want::is("charged")],
                "mark-paid",
            )
            .repair([Want::Missing, Want::is("charged")], "refund"),
        Rule::new("order-inventory", ["orders", "inventory"])
            .grace(GRACE)
            .consistent([
                Want::one_of(["paid", "awaiting_payment"]),
                Want::is("reserved"),
            ])
            .consistent([Want::is("cancelled"), Want::is("released")])
            .consistent([Want::is("awaiting_payment"), Want::Missing])
            .repair(
                [Want::is("cancelling"), Want::is("released")],
                "finish-cancel",
            ),
    ]
}

/// A reconciler over `systems` and `store`, with [`rules`].
pub(crate) fn reconciler<St: DifferenceStore>(systems: &Systems, store: St) -> Reconciler<St> {
    let mut b = Reconciler::builder(store)
        .source("orders", systems.orders.clone())
        .source("payments", systems.payments.clone())
        .source("inventory", systems.inventory.clone());
    for rule in rules() {
        b = b.rule(rule);
    }
    b.build().unwrap()
}

/// A repair target that keeps the ids it applied: a repeat is answered `Applied` without
/// applying again. Counts calls and applications per id.
#[derive(Clone, Default)]
pub(crate) struct Target {
    inner: Arc<Mutex<TargetState>>,
}

#[derive(Default)]
pub(crate) struct TargetState {
    pub(crate) calls: HashMap<RepairId, u32>,
    pub(crate) applied: HashMap<RepairId, u32>,
    pub(crate) keys: Vec<Bytes>,
}

impl Target {
    pub(crate) fn apply(&self, req: &RepairRequest) -> RepairAnswer {
        let mut s = self.inner.lock().unwrap();
        *s.calls.entry(req.id.clone()).or_default() += 1;
        if !s.applied.contains_key(&req.id) {
            s.applied.insert(req.id.clone(), 1);
            s.keys.push(req.key.clone());
        }
        RepairAnswer::Applied
    }

    pub(crate) fn calls(&self, id: &RepairId) -> u32 {
        self.inner
            .lock()
            .unwrap()
            .calls
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn applied(&self) -> HashMap<RepairId, u32> {
        self.inner.lock().unwrap().applied.clone()
    }

    pub(crate) fn keys(&self) -> Vec<Bytes> {
        self.inner.lock().unwrap().keys.clone()
    }

    /// As a service.
    pub(crate) fn service(
        &self,
    ) -> impl tower::Service<
        RepairRequest,
        Response = RepairAnswer,
        Error = std::io::Error,
        Future = impl Send + use<>,
    >
           + Send
           + 'static
           + use<> {
        let me = self.clone();
        tower::service_fn(move |req: RepairRequest| {
            let me = me.clone();
            async move { Ok(me.apply(&req)) }
        })
    }
}
