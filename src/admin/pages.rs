//! The router: the authorization and security headers around every request, the pages, the
//! JSON API, and the actions (audited, CSRF-checked).

use std::time::{Duration, SystemTime};

use askama::Template;
use axum::extract::rejection::{FormRejection, JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, NestedPath, Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Form, Json, Router};
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::StatusCode;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::{Deserialize, Serialize};

use super::action::{said, Kind};
use super::{Access, Action, ActionError, Admin};
use crate::inbox::{InboxError, Task, TaskState};
use crate::ledger::{Entry, EntryId, EntryState, Filter, LedgerError, SettledBy, Verdict};
use crate::outbox::{EventId, OutboxError, Quarantined};
use crate::reconcile::{Item, ItemState, ReconcileError, RepairId};

/// The largest body the admin reads: a form or a JSON body with a reason of 16 KiB and room
/// to spare.
const MAX_BODY: usize = 64 * 1024;
/// The header the JSON API's actions require (a cross-site form cannot send it).
const API_HEADER: &str = "x-surely-admin";
/// The most rows a list shows.
pub(super) const MAX_LIMIT: usize = 1000;

pub(super) fn router(admin: Admin) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/ledger", get(ledger_list))
        .route("/ledger/{id}", get(entry_page))
        .route("/outbox", get(outbox_list))
        .route("/outbox/{id}", get(event_page))
        .route("/differences", get(differences_list))
        .route("/differences/{id}", get(difference_page))
        .route("/tasks", get(tasks_list))
        .route("/tasks/{consumer}/{event}", get(task_page))
        .route("/tasks/{consumer}/{event}/{action}", post(task_form_post))
        .route("/{kind}/{id}/{action}", post(form_post))
        .route("/idempotency", get(idempotency_page))
        .route("/audit", get(audit_page))
        .route("/review", get(review_page))
        .route("/api/counts", get(api_counts))
        .route("/api/ledger", get(api_ledger_list))
        .route("/api/ledger/{id}", get(api_entry))
        .route("/api/outbox", get(api_outbox_list))
        .route("/api/outbox/{id}", get(api_event))
        .route("/api/differences", get(api_differences_list))
        .route("/api/differences/{id}", get(api_difference))
        .route("/api/tasks", get(api_tasks_list))
        .route("/api/tasks/{consumer}/{event}", get(api_task))
        .route(
            "/api/tasks/{consumer}/{event}/{action}",
            post(api_task_post),
        )
        .route("/api/{kind}/{id}/{action}", post(api_post))
        .route("/api/idempotency", get(api_idempotency))
        .route("/api/audit", get(api_audit))
        .route("/api/review", get(api_review))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(admin.clone(), guard))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(admin)
}

/// Who is asking, what they may do, and where the pages' links start.
#[derive(Clone, Debug)]
struct Operator {
    who: String,
    can_act: bool,
    /// The mount point (`/admin`), or empty at the root.
    base: String,
    api: bool,
}

/// What every page shows around its content.
struct Nav {
    who: String,
    can_act: bool,
    base: String,
    home: String,
    csrf: String,
}

impl Nav {
    fn of(admin: &Admin, op: &Operator) -> Self {
        Nav {
            who: op.who.clone(),
            can_act: op.can_act,
            base: op.base.clone(),
            home: if op.base.is_empty() {
                "/".to_owned()
            } else {
                op.base.clone()
            },
            csrf: if op.can_act {
                admin.inner.csrf.token(&op.who)
            } else {
                String::new()
            },
        }
    }
}

/// An answer other than the page: a status and why, as HTML or JSON.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    message: String,
    api: bool,
    base: String,
}

impl Refusal {
    fn new(op: &Operator, status: StatusCode, message: impl Into<String>) -> Self {
        Refusal {
            status,
            message: message.into(),
            api: op.api,
            base: op.base.clone(),
        }
    }
}

#[derive(Template)]
#[template(path = "admin/error.html")]
struct ErrorPage<'a> {
    nav: Nav,
    status: String,
    message: &'a str,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        if self.api {
            #[derive(Serialize)]
            struct Body<'a> {
                error: &'a str,
            }
            return (
                self.status,
                Json(Body {
                    error: &self.message,
                }),
            )
                .into_response();
        }
        let nav = Nav {
            who: String::new(),
            can_act: false,
            home: if self.base.is_empty() {
                "/".to_owned()
            } else {
                self.base.clone()
            },
            base: self.base,
            csrf: String::new(),
        };
        let page = ErrorPage {
            nav,
            status: self.status.to_string(),
            message: &self.message,
        };
        (self.status, render(&page)).into_response()
    }
}

fn render(page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "admin page failed to render"
            );
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page failed to render",
            )
                .into_response()
        }
    }
}

/// Every request: asks the hook, refuses what it denies, and sets the headers that keep the
/// pages from being framed, cached or given scripts.
async fn guard(State(admin): State<Admin>, mut req: Request, next: Next) -> Response {
    let base = req
        .extensions()
        .get::<NestedPath>()
        .map(|p| p.as_str().trim_end_matches('/').to_owned())
        .unwrap_or_default();
    let api = req
        .uri()
        .path()
        .strip_prefix('/')
        .is_some_and(|p| p == "api" || p.starts_with("api/"));
    let (parts, body) = req.into_parts();
    let access = admin.inner.authorize.check(&parts);
    req = Request::from_parts(parts, body);
    let mut op = Operator {
        who: String::new(),
        can_act: false,
        base,
        api,
    };
    let mut response = match access {
        Access::Denied => Refusal::new(
            &op,
            StatusCode::UNAUTHORIZED,
            "not authorized: the host's authorization hook refused this request",
        )
        .into_response(),
        Access::Read { who } | Access::Act { who }
            if crate::ledger::check_text(
                "the operator's name",
                &who,
                crate::ledger::MAX_WHO,
                false,
            )
            .is_err() =>
        {
            let _ = who;
            Refusal::new(
                &op,
                StatusCode::FORBIDDEN,
                "the authorization hook named an operator the audit log cannot keep (empty, over 256 bytes, or with a control character)",
            )
            .into_response()
        }
        Access::Read { who } => {
            op.who = who;
            req.extensions_mut().insert(op);
            next.run(req).await
        }
        Access::Act { who } => {
            op.who = who;
            op.can_act = true;
            req.extensions_mut().insert(op);
            next.run(req).await
        }
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn not_found(Extension(op): Extension<Operator>) -> Refusal {
    Refusal::new(&op, StatusCode::NOT_FOUND, "no such page")
}

// ---- views: what the pages and the JSON show -------------------------------------------

/// A duration as a person reads it: `3d 4h`, `12m 5s`, `850 ms`.
fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

fn when(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

/// The bytes a path segment cannot hold as they are.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b':');

fn link(id: &str) -> String {
    utf8_percent_encode(id, SEGMENT).to_string()
}

#[derive(Serialize)]
struct LedgerCounts {
    in_doubt: u64,
    open: u64,
    claimed: u64,
    manual: u64,
    settled: u64,
    oldest_unsettled: String,
    oldest_unsettled_secs: Option<u64>,
}

#[derive(Serialize)]
struct OutboxCounts {
    backlog: u64,
    quarantined: u64,
    /// The slowest log relay's slot: write-ahead log kept for it, in bytes.
    log_lag_bytes: Option<u64>,
    /// How long ago that slot's relay last confirmed it, in seconds.
    log_lag_secs: Option<u64>,
}

#[derive(Serialize)]
struct IdempotencyCounts {
    unknown: usize,
    stuck: usize,
    /// Of the stuck ones, those whose owner's lease has passed: abandoned.
    abandoned: usize,
}

#[derive(Serialize)]
struct DifferenceCounts {
    open: u64,
    manual: u64,
}

#[derive(Serialize)]
struct ReasonCount {
    state: &'static str,
    reason: &'static str,
    tasks: u64,
    oldest: String,
    oldest_secs: u64,
}

#[derive(Serialize)]
struct TaskCounts {
    waiting: u64,
    manual: u64,
    /// Tasks whose stored reason this version does not know (held).
    unknown: u64,
    by_reason: Vec<ReasonCount>,
}

#[derive(Serialize)]
struct Counts {
    ledger: Option<LedgerCounts>,
    outbox: Option<OutboxCounts>,
    idempotency: Option<IdempotencyCounts>,
    differences: Option<DifferenceCounts>,
    tasks: Option<TaskCounts>,
}

#[derive(Serialize)]
struct StepView {
    attempt: u32,
    at: String,
    reason: &'static str,
    why: String,
    delay: String,
    delay_ms: u128,
    clamped_from: Option<String>,
}

#[derive(Serialize)]
struct TaskView {
    consumer: String,
    #[serde(skip)]
    link: String,
    event: String,
    aggregate: String,
    version: i64,
    kind: String,
    /// The payload as text (invalid UTF-8 replaced), its first 64 KiB.
    payload: String,
    state: &'static str,
    reason: &'static str,
    attempts: u32,
    age: String,
    age_secs: u64,
    due_in: Option<String>,
    why: String,
    steps: Vec<StepView>,
}

impl TaskView {
    fn of(t: Task) -> Self {
        let bytes = t.event.payload();
        let shown = &bytes[..bytes.len().min(MAX_PAYLOAD_SHOWN)];
        TaskView {
            link: format!("{}/{}", link(&t.consumer), link(t.event.id().as_str())),
            consumer: t.consumer,
            event: t.event.id().as_str().to_owned(),
            aggregate: t.event.aggregate().to_owned(),
            version: t.event.version(),
            kind: t.event.kind().to_owned(),
            payload: String::from_utf8_lossy(shown).into_owned(),
            state: t.state.code(),
            reason: t.reason.code(),
            attempts: t.attempts,
            age: age(t.age),
            age_secs: t.age.as_secs(),
            due_in: t.due_in.map(age),
            why: t.why,
            steps: t
                .steps
                .into_iter()
                .map(|s| StepView {
                    attempt: s.attempt,
                    at: when(s.at),
                    reason: s.reason.code(),
                    why: s.why,
                    delay: age(s.delay),
                    delay_ms: s.delay.as_millis(),
                    clamped_from: s.clamped_from.map(|d| format!("{d:?}")),
                })
                .collect(),
        }
    }
}

#[derive(Serialize)]
struct AttemptView {
    attempt: u32,
    started_at: String,
    took_ms: u128,
    class: &'static str,
    phase: &'static str,
    timeout: Option<String>,
    hedge: bool,
    cancelled: bool,
    downstream_id: Option<String>,
}

#[derive(Serialize)]
struct SettlementView {
    verdict: &'static str,
    evidence: String,
    by: String,
    at: String,
}

#[derive(Serialize)]
struct EntryView {
    id: String,
    #[serde(skip)]
    link: String,
    state: &'static str,
    key: Option<String>,
    operation: Option<String>,
    semantics: &'static str,
    stop: &'static str,
    recorded_at: String,
    age: String,
    age_secs: u64,
    tries: u32,
    note: Option<String>,
    attempts: Vec<AttemptView>,
    settlement: Option<SettlementView>,
}

impl EntryView {
    fn of(e: Entry) -> Self {
        let ev = e.evidence;
        EntryView {
            link: link(ev.id.as_str()),
            id: ev.id.to_string(),
            state: e.state.as_str(),
            key: ev.key,
            operation: ev.operation,
            semantics: match ev.semantics {
                crate::Semantics::Safe => "safe",
                crate::Semantics::Idempotent => "idempotent",
                crate::Semantics::Keyed => "keyed",
                crate::Semantics::NonIdempotent => "non-idempotent",
            },
            stop: ev.stop.as_str(),
            recorded_at: when(ev.recorded_at),
            age: age(e.age),
            age_secs: e.age.as_secs(),
            tries: e.tries,
            note: e.note,
            attempts: ev
                .attempts
                .into_iter()
                .map(|a| AttemptView {
                    attempt: a.attempt,
                    started_at: when(a.started_at),
                    took_ms: a.took.as_millis(),
                    class: a.class.as_str(),
                    phase: a.phase.as_str(),
                    timeout: a.timeout,
                    hedge: a.hedge,
                    cancelled: a.cancelled,
                    downstream_id: a.downstream_id,
                })
                .collect(),
            settlement: e.settlement.map(|s| SettlementView {
                verdict: s.verdict.as_str(),
                evidence: s.evidence,
                by: match s.by {
                    SettledBy::Reconciler => "the reconciler".to_owned(),
                    SettledBy::Manual { who } => who,
                },
                at: when(s.at),
            }),
        }
    }
}

/// The most of a payload a page shows.
const MAX_PAYLOAD_SHOWN: usize = 64 * 1024;

#[derive(Serialize)]
struct EventView {
    id: String,
    #[serde(skip)]
    link: String,
    aggregate: String,
    version: i64,
    kind: String,
    headers: Vec<(String, String)>,
    /// The payload as text (invalid UTF-8 replaced), its first 64 KiB.
    payload: String,
    failures: u32,
    last_error: Option<String>,
    age: String,
    age_secs: u64,
}

impl EventView {
    fn of(q: Quarantined) -> Self {
        let e = &q.event;
        let bytes = e.payload();
        let shown = &bytes[..bytes.len().min(MAX_PAYLOAD_SHOWN)];
        EventView {
            id: e.id().as_str().to_owned(),
            link: link(e.id().as_str()),
            aggregate: e.aggregate().to_owned(),
            version: e.version(),
            kind: e.kind().to_owned(),
            headers: e.headers().to_vec(),
            payload: String::from_utf8_lossy(shown).into_owned(),
            failures: q.failures,
            last_error: q.last_error,
            age: age(q.age),
            age_secs: q.age.as_secs(),
        }
    }
}

#[derive(Serialize)]
struct SeenView {
    source: String,
    value: Option<String>,
    version: Option<u64>,
}

#[derive(Serialize)]
struct DifferenceView {
    id: String,
    #[serde(skip)]
    link: String,
    rule: String,
    /// The key as text, or `0x` and hex ([`Difference::key_display`](crate::reconcile::Difference::key_display)).
    key: String,
    state: &'static str,
    action: Option<String>,
    seen: Vec<SeenView>,
    tries: u32,
    note: Option<String>,
    who: Option<String>,
    age: String,
    age_secs: u64,
}

impl DifferenceView {
    fn of(item: Item) -> Self {
        let d = item.difference;
        DifferenceView {
            id: d.id.to_string(),
            link: link(d.id.as_str()),
            key: d.key_display(),
            rule: d.rule,
            state: item.state.as_str(),
            action: d.action,
            seen: d
                .seen
                .into_iter()
                .map(|s| SeenView {
                    source: s.source,
                    version: s.fact.as_ref().map(|f| f.version),
                    value: s.fact.map(|f| f.value),
                })
                .collect(),
            tries: item.tries,
            note: item.note,
            who: item.who,
            age: age(item.age),
            age_secs: item.age.as_secs(),
        }
    }
}

#[derive(Serialize)]
struct RecordView {
    tenant: String,
    operation: String,
    key: String,
    fence: u64,
    evidence: String,
    age: String,
    age_secs: u64,
    /// A processing record's lease: `passed` (abandoned: its owner died, and a round of
    /// `recover_abandoned` or the next request takes it over), or the time left; empty for an
    /// unknown record.
    lease: String,
}

#[derive(Serialize)]
struct IdempotencyView {
    unknown: Vec<RecordView>,
    stuck: Vec<RecordView>,
    stuck_after_secs: u64,
}

#[derive(Serialize)]
struct AuditView {
    id: u64,
    at: String,
    who: String,
    action: &'static str,
    target: String,
    why: String,
    outcome: Option<String>,
}

// ---- reading the stores ------------------------------------------------------------------

/// A store's failure, by the same kinds as an action's ([`ActionError`]).
fn refused(op: &Operator, e: ActionError) -> Refusal {
    let status = match e.kind() {
        Kind::Invalid => StatusCode::BAD_REQUEST,
        Kind::NotFound => StatusCode::NOT_FOUND,
        Kind::Conflict => StatusCode::CONFLICT,
        Kind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        Kind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    };
    Refusal::new(op, status, said(&e))
}

fn ledger_error(op: &Operator, e: LedgerError) -> Refusal {
    refused(op, ActionError::of_ledger(e))
}

fn outbox_error(op: &Operator, e: OutboxError) -> Refusal {
    refused(op, ActionError::of_outbox(e))
}

fn reconcile_error(op: &Operator, e: ReconcileError) -> Refusal {
    refused(op, ActionError::of_reconcile(e))
}

fn inbox_error(op: &Operator, e: InboxError) -> Refusal {
    refused(op, ActionError::of_inbox(e))
}

fn no_store(op: &Operator, what: &str) -> Refusal {
    Refusal::new(
        op,
        StatusCode::NOT_FOUND,
        format!("this admin was given no {what}"),
    )
}

async fn counts(admin: &Admin, op: &Operator) -> Result<Counts, Refusal> {
    let inner = &admin.inner;
    let ledger = match &inner.ledger {
        Some(l) => {
            let s = l.stats().await.map_err(|e| ledger_error(op, e))?;
            Some(LedgerCounts {
                in_doubt: s.in_doubt,
                open: s.open,
                claimed: s.claimed,
                manual: s.manual,
                settled: s.settled,
                oldest_unsettled: s.oldest_unsettled.map_or_else(|| "none".to_owned(), age),
                oldest_unsettled_secs: s.oldest_unsettled.map(|d| d.as_secs()),
            })
        }
        None => None,
    };
    let outbox = match &inner.outbox {
        Some(o) => {
            let s = o.stats().await.map_err(|e| outbox_error(op, e))?;
            Some(OutboxCounts {
                backlog: s.backlog,
                quarantined: s.quarantined,
                log_lag_bytes: s.log_lag_bytes,
                log_lag_secs: s.log_lag.map(|d| d.as_secs()),
            })
        }
        None => None,
    };
    let idempotency = match idempotency(admin, op).await? {
        Some(v) => Some(IdempotencyCounts {
            unknown: v.unknown.len(),
            stuck: v.stuck.len(),
            abandoned: v.stuck.iter().filter(|r| r.lease == "passed").count(),
        }),
        None => None,
    };
    let differences = match &inner.differences {
        Some(d) => {
            let s = d.stats().await.map_err(|e| reconcile_error(op, e))?;
            Some(DifferenceCounts {
                open: s.open(),
                manual: s.manual,
            })
        }
        None => None,
    };
    let tasks = match &inner.tasks {
        Some(t) => {
            let s = t.stats().await.map_err(|e| inbox_error(op, e))?;
            Some(TaskCounts {
                waiting: s.total(TaskState::Waiting),
                manual: s.total(TaskState::Manual),
                unknown: s.unknown,
                by_reason: s
                    .counts
                    .iter()
                    .map(|c| ReasonCount {
                        state: c.state.code(),
                        reason: c.reason.code(),
                        tasks: c.tasks,
                        oldest: age(c.oldest),
                        oldest_secs: c.oldest.as_secs(),
                    })
                    .collect(),
            })
        }
        None => None,
    };
    Ok(Counts {
        ledger,
        outbox,
        idempotency,
        differences,
        tasks,
    })
}

/// The tasks in `state` (`manual` unless asked; `waiting`, or `all`), at most `n`.
async fn tasks(
    admin: &Admin,
    op: &Operator,
    q: &ListQuery,
) -> Result<(&'static str, Vec<TaskView>), Refusal> {
    let store = admin
        .inner
        .tasks
        .as_ref()
        .ok_or_else(|| no_store(op, "task store"))?;
    let state = match q.state.as_deref() {
        None | Some("manual") => Some(TaskState::Manual),
        Some("waiting") => Some(TaskState::Waiting),
        Some("all") => None,
        Some(_) => {
            return Err(Refusal::new(
                op,
                StatusCode::BAD_REQUEST,
                "state is one of manual, waiting, all",
            ))
        }
    };
    let found = store
        .list(state, limit(q.limit))
        .await
        .map_err(|e| inbox_error(op, e))?;
    Ok((
        state.map_or("all", TaskState::code),
        found.into_iter().map(TaskView::of).collect(),
    ))
}

/// A consumer's name as a path gives it: 1 to 255 bytes, no control character.
fn consumer_name(op: &Operator, consumer: &str) -> Result<(), Refusal> {
    if consumer.is_empty() || consumer.len() > 255 || consumer.chars().any(char::is_control) {
        return Err(Refusal::new(
            op,
            StatusCode::BAD_REQUEST,
            "a consumer's name is 1 to 255 bytes without a control character",
        ));
    }
    Ok(())
}

async fn task(
    admin: &Admin,
    op: &Operator,
    consumer: &str,
    event: &str,
) -> Result<TaskView, Refusal> {
    let store = admin
        .inner
        .tasks
        .as_ref()
        .ok_or_else(|| no_store(op, "task store"))?;
    consumer_name(op, consumer)?;
    let event = event_id(op, event)?;
    match store
        .get(consumer, event.as_str())
        .await
        .map_err(|e| inbox_error(op, e))?
    {
        Some(t) => Ok(TaskView::of(t)),
        None => Err(Refusal::new(
            op,
            StatusCode::NOT_FOUND,
            format!(
                "no task of consumer {consumer} for event {}",
                event.as_str()
            ),
        )),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    state: Option<String>,
    key: Option<String>,
    limit: Option<usize>,
}

fn limit(n: Option<usize>) -> usize {
    n.unwrap_or(100).min(MAX_LIMIT)
}

fn query<T>(op: &Operator, q: Result<Query<T>, QueryRejection>) -> Result<T, Refusal> {
    q.map(|Query(q)| q)
        .map_err(|e| Refusal::new(op, StatusCode::BAD_REQUEST, e.body_text()))
}

async fn entries(
    admin: &Admin,
    op: &Operator,
    q: &ListQuery,
) -> Result<(EntryState, Vec<EntryView>), Refusal> {
    let ledger = admin
        .inner
        .ledger
        .as_ref()
        .ok_or_else(|| no_store(op, "ledger"))?;
    let state = match q.state.as_deref() {
        None => EntryState::Manual,
        Some(s) => EntryState::parse(s).ok_or_else(|| {
            Refusal::new(
                op,
                StatusCode::BAD_REQUEST,
                "state is one of in_doubt, open, claimed, manual, settled",
            )
        })?,
    };
    let mut filter = Filter::new().state(state).limit(limit(q.limit));
    if let Some(key) = &q.key {
        filter = filter.key(key.clone());
    }
    let found = ledger
        .list(&filter)
        .await
        .map_err(|e| ledger_error(op, e))?;
    Ok((state, found.into_iter().map(EntryView::of).collect()))
}

async fn differences(
    admin: &Admin,
    op: &Operator,
    q: &ListQuery,
) -> Result<(&'static str, Vec<DifferenceView>), Refusal> {
    let store = admin
        .inner
        .differences
        .as_ref()
        .ok_or_else(|| no_store(op, "reconciliation differences"))?;
    let state = match q.state.as_deref() {
        None => Some(ItemState::Manual),
        Some("all") => None,
        Some(s) => Some(ItemState::parse(s).ok_or_else(|| {
            Refusal::new(
                op,
                StatusCode::BAD_REQUEST,
                "state is one of open, claimed, repaired, manual, resolved, all",
            )
        })?),
    };
    let found = store
        .list(state, limit(q.limit))
        .await
        .map_err(|e| reconcile_error(op, e))?;
    Ok((
        state.map_or("all", ItemState::as_str),
        found.into_iter().map(DifferenceView::of).collect(),
    ))
}

fn repair_id(op: &Operator, id: &str) -> Result<RepairId, Refusal> {
    RepairId::parse(id).map_err(|e| Refusal::new(op, StatusCode::BAD_REQUEST, e.to_string()))
}

async fn difference(admin: &Admin, op: &Operator, id: &str) -> Result<DifferenceView, Refusal> {
    let store = admin
        .inner
        .differences
        .as_ref()
        .ok_or_else(|| no_store(op, "reconciliation differences"))?;
    let id = repair_id(op, id)?;
    match store.get(&id).await.map_err(|e| reconcile_error(op, e))? {
        Some(item) => Ok(DifferenceView::of(item)),
        None => Err(Refusal::new(
            op,
            StatusCode::NOT_FOUND,
            format!("no reconciliation difference {id}"),
        )),
    }
}

fn entry_id(op: &Operator, id: &str) -> Result<EntryId, Refusal> {
    EntryId::new(id).map_err(|e| Refusal::new(op, StatusCode::BAD_REQUEST, e.to_string()))
}

fn event_id(op: &Operator, id: &str) -> Result<EventId, Refusal> {
    EventId::new(id).map_err(|e| Refusal::new(op, StatusCode::BAD_REQUEST, e.to_string()))
}

async fn entry(admin: &Admin, op: &Operator, id: &str) -> Result<EntryView, Refusal> {
    let ledger = admin
        .inner
        .ledger
        .as_ref()
        .ok_or_else(|| no_store(op, "ledger"))?;
    let id = entry_id(op, id)?;
    match ledger.get(&id).await.map_err(|e| ledger_error(op, e))? {
        Some(e) => Ok(EntryView::of(e)),
        None => Err(ledger_error(op, LedgerError::not_found(&id))),
    }
}

async fn quarantined(admin: &Admin, op: &Operator, n: usize) -> Result<Vec<EventView>, Refusal> {
    let outbox = admin
        .inner
        .outbox
        .as_ref()
        .ok_or_else(|| no_store(op, "outbox"))?;
    let found = outbox
        .quarantined(n)
        .await
        .map_err(|e| outbox_error(op, e))?;
    Ok(found.into_iter().map(EventView::of).collect())
}

async fn event(admin: &Admin, op: &Operator, id: &str) -> Result<EventView, Refusal> {
    let outbox = admin
        .inner
        .outbox
        .as_ref()
        .ok_or_else(|| no_store(op, "outbox"))?;
    let id = event_id(op, id)?;
    match outbox
        .quarantined_event(&id)
        .await
        .map_err(|e| outbox_error(op, e))?
    {
        Some(q) => Ok(EventView::of(q)),
        None => Err(outbox_error(op, OutboxError::not_found(&id))),
    }
}

async fn idempotency(admin: &Admin, op: &Operator) -> Result<Option<IdempotencyView>, Refusal> {
    let Some(store) = &admin.inner.idempotency else {
        return Ok(None);
    };
    let failed = |e: crate::server::store::StoreError| {
        Refusal::new(op, StatusCode::SERVICE_UNAVAILABLE, said(&e))
    };
    let view =
        |key: &crate::server::store::RecordKey, fence: u64, evidence: String, d: Duration| {
            RecordView {
                tenant: key.tenant().to_owned(),
                operation: key.operation().to_owned(),
                key: key.key().as_str().to_owned(),
                fence,
                evidence,
                age: age(d),
                age_secs: d.as_secs(),
                lease: String::new(),
            }
        };
    let unknown = store.unknowns(MAX_LIMIT).await.map_err(failed)?;
    let stuck = store
        .stuck(admin.inner.stuck_after, MAX_LIMIT)
        .await
        .map_err(failed)?;
    // Whether each stuck record's lease has passed: one read of each (the list is what has
    // processed for longer than the threshold, a handful unless something is wrong).
    let mut stuck_views = Vec::with_capacity(stuck.len());
    for r in stuck {
        let mut v = view(&r.key, r.fence.get(), String::new(), r.age);
        v.lease = match store.inspect(&r.key).await {
            Ok(Some(found)) => match found.state {
                crate::server::store::RecordState::Processing { lease_left }
                    if lease_left.is_zero() =>
                {
                    "passed".to_owned()
                }
                crate::server::store::RecordState::Processing { lease_left } => {
                    format!("{} left", age(lease_left))
                }
                // Moved since it was listed.
                _ => "settled since".to_owned(),
            },
            Ok(None) => "gone since".to_owned(),
            // A store of its own that does not read single records.
            Err(_) => String::new(),
        };
        stuck_views.push(v);
    }
    Ok(Some(IdempotencyView {
        unknown: unknown
            .into_iter()
            .map(|r| view(&r.key, r.fence.get(), r.evidence, r.age))
            .collect(),
        stuck: stuck_views,
        stuck_after_secs: admin.inner.stuck_after.as_secs(),
    }))
}

async fn audit_lines(admin: &Admin, op: &Operator, n: usize) -> Result<Vec<AuditView>, Refusal> {
    let lines = admin
        .inner
        .audit
        .list(n)
        .await
        .map_err(|e| Refusal::new(op, StatusCode::SERVICE_UNAVAILABLE, said(&e)))?;
    Ok(lines
        .into_iter()
        .map(|l| AuditView {
            id: l.id,
            at: when(l.at),
            who: l.who,
            action: l.action.as_str(),
            target: l.target,
            why: l.why,
            outcome: l.outcome,
        })
        .collect())
}

// ---- the actions -------------------------------------------------------------------------

/// What an action was asked to do, its id still a string.
enum Act {
    Settle(Verdict),
    RetryNow,
    Requeue,
    Discard,
    Resolve,
    /// A task of this consumer: retry it now.
    RetryTask(String),
    /// A task of this consumer: discard it.
    DiscardTask(String),
}

/// Takes an action for `op` ([`Admin::act`]: audited). Returns where the pages go next.
async fn act(
    admin: &Admin,
    op: &Operator,
    what: Act,
    id: &str,
    why: &str,
) -> Result<String, Refusal> {
    if !op.can_act {
        return Err(Refusal::new(
            op,
            StatusCode::FORBIDDEN,
            format!("{} may read, not act", op.who),
        ));
    }
    let (action, next) = match what {
        Act::Settle(verdict) => {
            let entry = entry_id(op, id)?;
            let next = format!("ledger/{}", link(entry.as_str()));
            (Action::Settle { entry, verdict }, next)
        }
        Act::RetryNow => {
            let entry = entry_id(op, id)?;
            let next = format!("ledger/{}", link(entry.as_str()));
            (Action::RetryNow(entry), next)
        }
        Act::Requeue => (Action::Requeue(event_id(op, id)?), "outbox".to_owned()),
        Act::Discard => (Action::Discard(event_id(op, id)?), "outbox".to_owned()),
        Act::Resolve => {
            let repair = repair_id(op, id)?;
            let next = format!("differences/{}", link(repair.as_str()));
            (Action::Resolve(repair), next)
        }
        Act::RetryTask(consumer) => {
            consumer_name(op, &consumer)?;
            let event = event_id(op, id)?;
            let next = format!("tasks/{}/{}", link(&consumer), link(event.as_str()));
            (Action::RetryTask { consumer, event }, next)
        }
        Act::DiscardTask(consumer) => {
            consumer_name(op, &consumer)?;
            let event = event_id(op, id)?;
            (Action::DiscardTask { consumer, event }, "tasks".to_owned())
        }
    };
    admin
        .act(&op.who, action, why)
        .await
        .map_err(|e| refused(op, e))?;
    Ok(next)
}

/// A form's fields: the token, the verdict (settle only), why.
#[derive(Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    verdict: String,
    #[serde(default)]
    why: String,
}

/// A JSON action's body.
#[derive(Deserialize)]
struct ActionBody {
    #[serde(default)]
    verdict: String,
    why: String,
}

fn verdict(op: &Operator, v: &str) -> Result<Verdict, Refusal> {
    Verdict::parse(v).ok_or_else(|| {
        Refusal::new(
            op,
            StatusCode::BAD_REQUEST,
            "verdict is succeeded or failed",
        )
    })
}

/// The action a POST names: `ledger/{id}/settle` (with its verdict), `ledger/{id}/retry`,
/// `outbox/{id}/requeue`, `outbox/{id}/discard`, `differences/{id}/resolve`.
fn named(op: &Operator, kind: &str, action: &str, verdict_named: &str) -> Result<Act, Refusal> {
    match (kind, action) {
        ("ledger", "settle") => verdict(op, verdict_named).map(Act::Settle),
        ("ledger", "retry") => Ok(Act::RetryNow),
        ("outbox", "requeue") => Ok(Act::Requeue),
        ("outbox", "discard") => Ok(Act::Discard),
        ("differences", "resolve") => Ok(Act::Resolve),
        _ => Err(Refusal::new(op, StatusCode::NOT_FOUND, "no such action")),
    }
}

/// The action a task's POST names: `tasks/{consumer}/{event}/retry` or `.../discard`.
fn task_named(op: &Operator, consumer: &str, action: &str) -> Result<Act, Refusal> {
    match action {
        "retry" => Ok(Act::RetryTask(consumer.to_owned())),
        "discard" => Ok(Act::DiscardTask(consumer.to_owned())),
        _ => Err(Refusal::new(op, StatusCode::NOT_FOUND, "no such action")),
    }
}

async fn task_form_post(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path((consumer, event, action)): Path<(String, String, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Redirect, Refusal> {
    form_action(&admin, &op, form, &event, |_| {
        task_named(&op, &consumer, &action)
    })
    .await
}

async fn api_task_post(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path((consumer, event, action)): Path<(String, String, String)>,
    headers: http::HeaderMap,
    body: Result<Json<ActionBody>, JsonRejection>,
) -> Result<Response, Refusal> {
    api_action(&admin, &op, &headers, body, &event, |_| {
        task_named(&op, &consumer, &action)
    })
    .await
}

async fn form_post(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path((kind, id, action)): Path<(String, String, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<Redirect, Refusal> {
    form_action(&admin, &op, form, &id, |f| {
        named(&op, &kind, &action, &f.verdict)
    })
    .await
}

async fn api_post(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path((kind, id, action)): Path<(String, String, String)>,
    headers: http::HeaderMap,
    body: Result<Json<ActionBody>, JsonRejection>,
) -> Result<Response, Refusal> {
    api_action(&admin, &op, &headers, body, &id, |b| {
        named(&op, &kind, &action, &b.verdict)
    })
    .await
}

/// A form action: checks the token, acts, and sends the browser on (303).
async fn form_action(
    admin: &Admin,
    op: &Operator,
    form: Result<Form<ActionForm>, FormRejection>,
    id: &str,
    what: impl FnOnce(&ActionForm) -> Result<Act, Refusal>,
) -> Result<Redirect, Refusal> {
    if !op.can_act {
        return Err(Refusal::new(
            op,
            StatusCode::FORBIDDEN,
            format!("{} may read, not act", op.who),
        ));
    }
    let Form(form) = form.map_err(|e| Refusal::new(op, e.status(), e.body_text()))?;
    if !admin.inner.csrf.check(&op.who, &form.csrf) {
        return Err(Refusal::new(
            op,
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or wrong: reload the page and try again",
        ));
    }
    let act_on = what(&form)?;
    let next = act(admin, op, act_on, id, &form.why).await?;
    Ok(Redirect::to(&format!("{}/{next}", op.base)))
}

/// A JSON action: checks the header and the content type, acts, and answers `{"done": ...}`.
async fn api_action(
    admin: &Admin,
    op: &Operator,
    headers: &http::HeaderMap,
    body: Result<Json<ActionBody>, JsonRejection>,
    id: &str,
    what: impl FnOnce(&ActionBody) -> Result<Act, Refusal>,
) -> Result<Response, Refusal> {
    let json = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if headers.get(API_HEADER).map(HeaderValue::as_bytes) != Some(b"1") || !json {
        return Err(Refusal::new(
            op,
            StatusCode::FORBIDDEN,
            "an API action needs the header x-surely-admin: 1 and a JSON body (application/json)",
        ));
    }
    let Json(body) = body.map_err(|e| Refusal::new(op, e.status(), e.body_text()))?;
    let act_on = what(&body)?;
    act(admin, op, act_on, id, &body.why).await?;
    #[derive(Serialize)]
    struct Done<'a> {
        done: &'a str,
    }
    Ok(Json(Done { done: id }).into_response())
}

// ---- handlers ----------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "admin/index.html")]
struct IndexPage {
    nav: Nav,
    counts: Counts,
}

async fn index(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
) -> Result<Response, Refusal> {
    let counts = counts(&admin, &op).await?;
    Ok(render(&IndexPage {
        nav: Nav::of(&admin, &op),
        counts,
    }))
}

async fn api_counts(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
) -> Result<Json<Counts>, Refusal> {
    counts(&admin, &op).await.map(Json)
}

#[derive(Template)]
#[template(path = "admin/ledger.html")]
struct LedgerPage {
    nav: Nav,
    state: &'static str,
    entries: Vec<EntryView>,
    /// On the manual queue's page, the tasks in the manual queue too (none without a task
    /// store).
    tasks: Vec<TaskView>,
}

async fn ledger_list(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(&op, q)?;
    let (state, entries) = entries(&admin, &op, &q).await?;
    let tasks = match (&admin.inner.tasks, state) {
        (Some(store), EntryState::Manual) => store
            .list(Some(TaskState::Manual), limit(q.limit))
            .await
            .map_err(|e| inbox_error(&op, e))?
            .into_iter()
            .map(TaskView::of)
            .collect(),
        _ => Vec::new(),
    };
    Ok(render(&LedgerPage {
        nav: Nav::of(&admin, &op),
        state: state.as_str(),
        entries,
        tasks,
    }))
}

async fn api_ledger_list(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Vec<EntryView>>, Refusal> {
    let q = query(&op, q)?;
    entries(&admin, &op, &q).await.map(|(_, e)| Json(e))
}

#[derive(Template)]
#[template(path = "admin/entry.html")]
struct EntryPage {
    nav: Nav,
    e: EntryView,
}

async fn entry_page(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Result<Response, Refusal> {
    let e = entry(&admin, &op, &id).await?;
    Ok(render(&EntryPage {
        nav: Nav::of(&admin, &op),
        e,
    }))
}

async fn api_entry(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Result<Json<EntryView>, Refusal> {
    entry(&admin, &op, &id).await.map(Json)
}

#[derive(Template)]
#[template(path = "admin/outbox.html")]
struct OutboxPage {
    nav: Nav,
    events: Vec<EventView>,
}

#[derive(Deserialize)]
struct LimitQuery {
    limit: Option<usize>,
}

async fn outbox_list(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(&op, q)?;
    let events = quarantined(&admin, &op, limit(q.limit)).await?;
    Ok(render(&OutboxPage {
        nav: Nav::of(&admin, &op),
        events,
    }))
}

async fn api_outbox_list(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Json<Vec<EventView>>, Refusal> {
    let q = query(&op, q)?;
    quarantined(&admin, &op, limit(q.limit)).await.map(Json)
}

#[derive(Template)]
#[template(path = "admin/event.html")]
struct EventPage {
    nav: Nav,
    q: EventView,
}

async fn event_page(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Result<Response, Refusal> {
    let q = event(&admin, &op, &id).await?;
    Ok(render(&EventPage {
        nav: Nav::of(&admin, &op),
        q,
    }))
}

async fn api_event(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Result<Json<EventView>, Refusal> {
    event(&admin, &op, &id).await.map(Json)
}

#[derive(Template)]
#[template(path = "admin/differences.html")]
struct DifferencesPage {
    nav: Nav,
    state: &'static str,
    items: Vec<DifferenceView>,
}

async fn differences_list(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(&op, q)?;
    let (state, items) = differences(&admin, &op, &q).await?;
    Ok(render(&DifferencesPage {
        nav: Nav::of(&admin, &op),
        state,
        items,
    }))
}

async fn api_differences_list(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Vec<DifferenceView>>, Refusal> {
    let q = query(&op, q)?;
    differences(&admin, &op, &q).await.map(|(_, d)| Json(d))
}

#[derive(Template)]
#[template(path = "admin/difference.html")]
struct DifferencePage {
    nav: Nav,
    d: DifferenceView,
}

async fn difference_page(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Result<Response, Refusal> {
    let d = difference(&admin, &op, &id).await?;
    Ok(render(&DifferencePage {
        nav: Nav::of(&admin, &op),
        d,
    }))
}

async fn api_difference(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Result<Json<DifferenceView>, Refusal> {
    difference(&admin, &op, &id).await.map(Json)
}

#[derive(Template)]
#[template(path = "admin/idempotency.html")]
struct IdempotencyPage {
    nav: Nav,
    unknown: Vec<RecordView>,
    stuck: Vec<RecordView>,
    stuck_after: String,
}

async fn idempotency_page(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
) -> Result<Response, Refusal> {
    let view = idempotency(&admin, &op)
        .await?
        .ok_or_else(|| no_store(&op, "idempotency store"))?;
    Ok(render(&IdempotencyPage {
        nav: Nav::of(&admin, &op),
        unknown: view.unknown,
        stuck: view.stuck,
        stuck_after: age(admin.inner.stuck_after),
    }))
}

async fn api_idempotency(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
) -> Result<Json<IdempotencyView>, Refusal> {
    idempotency(&admin, &op)
        .await?
        .ok_or_else(|| no_store(&op, "idempotency store"))
        .map(Json)
}

#[derive(Template)]
#[template(path = "admin/review.html")]
struct ReviewPage<'a> {
    nav: Nav,
    review: &'a crate::review::Review,
}

/// The running service's review, or why there is none.
fn the_review<'a>(admin: &'a Admin, op: &Operator) -> Result<&'a crate::review::Review, Refusal> {
    match &admin.inner.review {
        None => Err(no_store(op, "chain to review")),
        Some(Err(e)) => Err(Refusal::new(
            op,
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the chain could not be reviewed: {e}"),
        )),
        Some(Ok(review)) => Ok(review),
    }
}

async fn review_page(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
) -> Result<Response, Refusal> {
    let review = the_review(&admin, &op)?;
    Ok(render(&ReviewPage {
        nav: Nav::of(&admin, &op),
        review,
    }))
}

async fn api_review(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
) -> Result<Response, Refusal> {
    let review = the_review(&admin, &op)?;
    Ok(Json(review).into_response())
}

#[derive(Template)]
#[template(path = "admin/audit.html")]
struct AuditPage {
    nav: Nav,
    lines: Vec<AuditView>,
}

async fn audit_page(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(&op, q)?;
    let lines = audit_lines(&admin, &op, limit(q.limit)).await?;
    Ok(render(&AuditPage {
        nav: Nav::of(&admin, &op),
        lines,
    }))
}

async fn api_audit(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Json<Vec<AuditView>>, Refusal> {
    let q = query(&op, q)?;
    audit_lines(&admin, &op, limit(q.limit)).await.map(Json)
}

#[derive(Template)]
#[template(path = "admin/tasks.html")]
struct TasksPage {
    nav: Nav,
    state: &'static str,
    tasks: Vec<TaskView>,
}

async fn tasks_list(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, Refusal> {
    let q = query(&op, q)?;
    let (state, tasks) = tasks(&admin, &op, &q).await?;
    Ok(render(&TasksPage {
        nav: Nav::of(&admin, &op),
        state,
        tasks,
    }))
}

async fn api_tasks_list(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Vec<TaskView>>, Refusal> {
    let q = query(&op, q)?;
    tasks(&admin, &op, &q).await.map(|(_, t)| Json(t))
}

#[derive(Template)]
#[template(path = "admin/task.html")]
struct TaskPage {
    nav: Nav,
    t: TaskView,
}

async fn task_page(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path((consumer, event)): Path<(String, String)>,
) -> Result<Response, Refusal> {
    let t = task(&admin, &op, &consumer, &event).await?;
    Ok(render(&TaskPage {
        nav: Nav::of(&admin, &op),
        t,
    }))
}

async fn api_task(
    State(admin): State<Admin>,
    Extension(op): Extension<Operator>,
    Path((consumer, event)): Path<(String, String)>,
) -> Result<Json<TaskView>, Refusal> {
    task(&admin, &op, &consumer, &event).await.map(Json)
}
