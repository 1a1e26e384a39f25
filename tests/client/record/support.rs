//! Shared helpers for the record tests: scripted transports, the canonical client stack, and a
//! `tracing` layer that captures spans and events.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use surely::deadline::SetDeadlineLayer;
use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
use surely::timeout::AttemptTimeoutLayer;
use tower::{service_fn, Service, ServiceBuilder};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

pub(crate) use crate::support::call;
pub(crate) use crate::support::time::{ms, secs};

pub(crate) type Req = Request<String>;
pub(crate) type Res = Response<String>;

pub(crate) fn post(uri: &str) -> Req {
    Request::post(uri).body(String::new()).unwrap()
}

pub(crate) fn get(uri: &str) -> Req {
    Request::get(uri).body(String::new()).unwrap()
}

/// A transport answering every request with `status` and `headers`, after `delay`, counting
/// its calls.
#[derive(Clone, Debug)]
pub(crate) struct Script {
    pub(crate) calls: Arc<AtomicUsize>,
}

impl Script {
    pub(crate) fn new() -> Self {
        Script {
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Answers `status` with `headers` after `delay`.
    pub(crate) fn answer(
        &self,
        status: u16,
        headers: &[(&'static str, &'static str)],
        delay: Duration,
    ) -> impl Service<Req, Response = Res, Error = io::Error> + Clone + use<> {
        let calls = self.calls.clone();
        let headers = headers.to_vec();
        service_fn(move |_req: Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            let mut res = Response::builder().status(status);
            for (k, v) in &headers {
                res = res.header(*k, *v);
            }
            let res = res.body(format!("status {status}")).unwrap();
            async move {
                tokio::time::sleep(delay).await;
                Ok(res)
            }
        })
    }

    /// Never answers.
    pub(crate) fn hang(
        &self,
    ) -> impl Service<Req, Response = Res, Error = io::Error> + Clone + use<> {
        let calls = self.calls.clone();
        service_fn(move |_req: Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                std::future::pending::<()>().await;
                Ok(Response::new(String::new()))
            }
        })
    }
}

/// The canonical client stack: RecordCall → Deadline → RecordAttempt → AttemptTimeout →
/// transport.
pub(crate) fn canonical<T>(
    records: &InMemoryRecorder,
    budget: Duration,
    per_try: Duration,
    transport: T,
) -> impl Service<Req, Response = Res, Error = surely::Error<io::Error>> + use<T>
where
    T: Service<Req, Response = Res, Error = io::Error>,
{
    ServiceBuilder::new()
        .layer(RecordCallLayer::new(records.clone()))
        .layer(SetDeadlineLayer::new(budget))
        .layer(RecordAttemptLayer::new(records.clone()))
        .layer(AttemptTimeoutLayer::new(per_try))
        .service(transport)
}

// ---- tracing capture ----------------------------------------------------------------------

/// A `tracing` layer that keeps every span (name, parent, fields as recorded) and event.
#[derive(Clone, Debug, Default)]
pub(crate) struct Capture(Arc<Mutex<Captured>>);

#[derive(Clone, Debug, Default)]
pub(crate) struct Captured {
    pub(crate) spans: Vec<SpanData>,
    pub(crate) events: Vec<EventData>,
}

#[derive(Clone, Debug)]
pub(crate) struct SpanData {
    pub(crate) name: &'static str,
    /// The index of the parent span in `spans`.
    pub(crate) parent: Option<usize>,
    pub(crate) fields: BTreeMap<String, String>,
}

#[derive(Clone, Debug)]
pub(crate) struct EventData {
    pub(crate) level: Level,
    /// The index of the span the event happened in.
    pub(crate) span: Option<usize>,
    pub(crate) fields: BTreeMap<String, String>,
}

impl SpanData {
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

impl EventData {
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

impl Captured {
    /// The spans named `name`, with their indices.
    pub(crate) fn spans_named(&self, name: &str) -> Vec<(usize, SpanData)> {
        self.spans
            .iter()
            .enumerate()
            .filter(|(_, s)| s.name == name)
            .map(|(i, s)| (i, s.clone()))
            .collect()
    }
}

impl Capture {
    /// Installs this capture as the thread's default subscriber until the guard drops.
    pub(crate) fn install(&self) -> tracing::subscriber::DefaultGuard {
        use tracing_subscriber::layer::SubscriberExt;
        tracing::subscriber::set_default(tracing_subscriber::registry().with(self.clone()))
    }

    pub(crate) fn get(&self) -> Captured {
        self.0.lock().unwrap().clone()
    }
}

/// The index of a span in `Captured::spans`, kept in the registry's span extensions (the
/// registry reuses ids).
struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S> Layer<S> for Capture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a new span is in the registry");
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Index>().map(|i| i.0));
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut captured = self.0.lock().unwrap();
        captured.spans.push(SpanData {
            name: attrs.metadata().name(),
            parent,
            fields,
        });
        span.extensions_mut()
            .insert(Index(captured.spans.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a recorded span is in the registry");
        let Some(index) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        let mut captured = self.0.lock().unwrap();
        values.record(&mut Fields(&mut captured.spans[index].fields));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let span = ctx
            .event_span(event)
            .and_then(|s| s.extensions().get::<Index>().map(|i| i.0));
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().events.push(EventData {
            level: *event.metadata().level(),
            span,
            fields,
        });
    }
}
