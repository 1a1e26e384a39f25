//! Reconciliation's reports as gauges: open differences per rule (0 once a rule has none left),
//! the manual queue, the oldest open one's age.

use std::time::{Duration, SystemTime};

use surely::reconcile::{
    MemoryDifferences, MemorySource, Reconciler, RepairAnswer, RepairRequest, Repairer, Rule, Want,
};
use tower::service_fn;

use super::Metrics;

#[tokio::test(start_paused = true)]
async fn open_differences_are_gauges_by_rule() {
    let metrics = Metrics::new();
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let (orders, payments) = (MemorySource::new(), MemorySource::new());
    orders.put("o-1", "awaiting_payment", 1, hour_ago);
    payments.put("o-1", "charged", 1, hour_ago);
    orders.put("o-2", "lost", 1, hour_ago);
    payments.put("o-2", "charged", 1, hour_ago);
    let store = MemoryDifferences::new();
    let mut reconciler = Reconciler::builder(store.clone())
        .source("orders", orders.clone())
        .source("payments", payments.clone())
        .rule(
            Rule::new("payment-order", ["orders", "payments"])
                .consistent([Want::is("paid"), Want::is("charged")])
                .repair(
                    [Want::is("awaiting_payment"), Want::is("charged")],
                    "mark-paid",
                ),
        )
        .recorder(metrics.recorder())
        .build()
        .unwrap();
    reconciler.run_once(SystemTime::now()).await.unwrap();
    let rule = [("surely.rule", "payment-order")];
    assert_eq!(metrics.gauge("surely.reconcile.open", &rule), Some(2));
    assert_eq!(metrics.gauge("surely.reconcile.manual", &[]), Some(1));

    tokio::time::advance(Duration::from_secs(30)).await;
    let applied =
        service_fn(|_req: RepairRequest| async { Ok::<_, std::io::Error>(RepairAnswer::Applied) });
    let mut repairer = Repairer::builder(store.clone(), applied).build().unwrap();
    assert_eq!(repairer.run_once().await.unwrap().repaired, 1);
    reconciler.report().await.unwrap();
    assert_eq!(metrics.gauge("surely.reconcile.open", &rule), Some(1));
    assert_eq!(metrics.gauge_f64("surely.reconcile.oldest_age"), Some(30.0));

    // The manual one resolved: the rule reads 0, not its last count.
    let id = store.list(None, 10).await.unwrap()[1].difference.id.clone();
    use surely::reconcile::DifferenceStore as _;
    store
        .resolve_manually(&id, "ana", "order found")
        .await
        .unwrap();
    reconciler.report().await.unwrap();
    assert_eq!(metrics.gauge("surely.reconcile.open", &rule), Some(0));
    assert_eq!(metrics.gauge("surely.reconcile.manual", &[]), Some(0));
    assert_eq!(metrics.gauge_f64("surely.reconcile.oldest_age"), Some(0.0));
}
