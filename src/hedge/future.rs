//! The hedge layer's future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::layer::Config;
use crate::budget::RetryBudget;
use crate::classify::{
    AttemptClass, Classification, Classify, DeliveryPhase, MakeClassifier, OutcomeTally,
};
use crate::context::budget_left_now;
use crate::context::CallTally;
use crate::error::{lift, lift_poll};
use crate::outcome::{CallOutcome, Outcome, StopReason};
use crate::pushback::Pushback;
use crate::time::later;
use crate::{Envelope, Error, IntoError};

type Output<S, Req> = Result<
    <S as Service<Req>>::Response,
    Error<<<S as Service<Req>>::Error as IntoError>::Transport>,
>;

pin_project! {
    /// The future of [`Hedge`](super::Hedge): the first attempt, inline, and the hedges sent
    /// after it, if any.
    ///
    /// A call that is not hedged (its semantics forbid it, or the first attempt answers before
    /// the delay) allocates nothing here. Each hedge sent is boxed.
    pub struct ResponseFuture<S, Req, M>
    where
        S: Service<Req>,
        S::Error: IntoError,
        M: MakeClassifier<Req>,
    {
        #[pin]
        first: Slot<S::Future>,
        #[pin]
        timer: Timer,
        // `None` for a request that is not hedged.
        race: Option<Race<S, Req, M>>,
    }
}

pin_project! {
    #[project = SlotProj]
    enum Slot<F> {
        Running { #[pin] future: F },
        Done,
    }
}

pin_project! {
    #[project = TimerProj]
    enum Timer {
        Idle,
        Armed { #[pin] sleep: Sleep },
    }
}

/// What a hedge layer's service shares with its hedged calls' futures: the layer's settings,
/// and the copy of the inner service each hedge clones the service it is sent through from.
pub(super) type Shared<S, M> = crate::spare::Shared<S, Config<M>>;

/// A hedge in flight.
struct Attempt<F, C> {
    future: Pin<Box<F>>,
    classifier: Option<C>,
    started: Instant,
}

/// The state of a hedged call.
struct Race<S, Req, M>
where
    S: Service<Req>,
    S::Error: IntoError,
    M: MakeClassifier<Req>,
{
    /// The first attempt's classifier, until it answers.
    classifier: Option<M::Classifier>,
    template: Req,
    /// The layer's settings, and the copy of the inner service the hedges are cloned from.
    shared: Arc<Shared<S, M>>,
    /// A hedge's clone of the service that was not ready at once.
    readying: Option<Box<S>>,
    /// The budget a retry layer outside lent this call, for a layer given none of its own.
    lent: Option<Arc<dyn RetryBudget>>,
    /// When the first attempt was first seen pending; `None` while it never was.
    first_started: Option<Instant>,
    hedges: Vec<Attempt<S::Future, M::Classifier>>,
    /// Attempts sent, the first included.
    sent: u32,
    /// A hedge is due: the delay passed, or an attempt failed.
    due: bool,
    /// A hedge was admitted (its budget withdrawn) and waits for the service to be ready.
    admitted: bool,
    /// No more hedges for this call: the limit, the budget or the deadline said so.
    stopped: bool,
    /// The latest failure, the call's result if no attempt answers: boxed, since most calls
    /// have none and every layer outside moves this future.
    last: Option<Box<(Output<S, Req>, AttemptClass)>>,
    /// What the finished attempts add up to.
    tally: OutcomeTally,
}

/// What one finished attempt means for the race.
enum Verdict<O> {
    /// An answer: the call's result.
    Win(O),
    /// A health failure: kept as the latest, and the next hedge may be sent.
    Lose(Option<Pushback>),
}

impl<S, Req, M> ResponseFuture<S, Req, M>
where
    S: Service<Req>,
    S::Error: IntoError,
    M: MakeClassifier<Req>,
{
    pub(super) fn passthrough(future: S::Future) -> Self {
        ResponseFuture {
            first: Slot::Running { future },
            timer: Timer::Idle,
            race: None,
        }
    }

    pub(super) fn hedged(
        future: S::Future,
        classifier: M::Classifier,
        semantics: crate::Semantics,
        template: Req,
        shared: Arc<Shared<S, M>>,
        lent: Option<Arc<dyn RetryBudget>>,
    ) -> Self {
        ResponseFuture {
            first: Slot::Running { future },
            timer: Timer::Idle,
            race: Some(Race {
                classifier: Some(classifier),
                template,
                shared,
                readying: None,
                lent,
                first_started: None,
                hedges: Vec::new(),
                sent: 1,
                due: false,
                admitted: false,
                stopped: false,
                last: None,
                tally: OutcomeTally::new(semantics),
            }),
        }
    }
}

impl<S, Req, M, T> Future for ResponseFuture<S, Req, M>
where
    S: Service<Req> + Clone,
    S::Error: IntoError<Transport = T>,
    S::Response: Envelope,
    Req: Envelope + Clone,
    M: MakeClassifier<Req>,
    M::Classifier: Classify<S::Response, Error<T>>,
{
    type Output = Result<S::Response, Error<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(race) = this.race.as_mut() else {
            return match this.first.project() {
                SlotProj::Running { future } => lift_poll(future.poll(cx)),
                SlotProj::Done => Poll::Pending,
            };
        };
        loop {
            // The first attempt.
            if let SlotProj::Running { future } = this.first.as_mut().project()
                && let Poll::Ready(out) = future.poll(cx)
            {
                this.first.set(Slot::Done);
                let out = lift(out);
                let started = race.first_started;
                let classifier = race.classifier.take();
                match race.judge(out, classifier, started) {
                    Verdict::Win(out) => return Poll::Ready(race.finish(out, this.first)),
                    Verdict::Lose(pushback) => {
                        let others = !race.hedges.is_empty();
                        race.failed(pushback, others, this.timer.as_mut());
                    }
                }
            }
            // The hedges, in the order they were sent.
            let mut i = 0;
            while i < race.hedges.len() {
                let Poll::Ready(out) = race.hedges[i].future.as_mut().poll(cx) else {
                    i += 1;
                    continue;
                };
                let mut done = race.hedges.remove(i);
                let out = lift(out);
                match race.judge(out, done.classifier.take(), Some(done.started)) {
                    Verdict::Win(out) => {
                        drop(done);
                        return Poll::Ready(race.finish(out, this.first));
                    }
                    Verdict::Lose(pushback) => {
                        let others =
                            matches!(*this.first, Slot::Running { .. }) || !race.hedges.is_empty();
                        race.failed(pushback, others, this.timer.as_mut());
                    }
                }
            }
            // The delay.
            if let TimerProj::Armed { sleep } = this.timer.as_mut().project()
                && sleep.poll(cx).is_ready()
            {
                this.timer.set(Timer::Idle);
                race.due = true;
            }
            if race.due && !race.stopped {
                match race.send(cx) {
                    Poll::Ready(true) => {
                        // The next hedge, after the delay.
                        if race.sent < race.shared.config.max_attempts {
                            let at = later(Instant::now(), race.shared.config.delay.current());
                            this.timer.set(Timer::Armed {
                                sleep: tokio::time::sleep_until(at),
                            });
                        }
                        // Poll the new hedge once: it may answer at once, and it must
                        // register its waker.
                        continue;
                    }
                    Poll::Ready(false) => {}
                    // Waits for the service to be ready; the attempts in flight go on.
                    Poll::Pending => {}
                }
            }
            let in_flight = matches!(*this.first, Slot::Running { .. }) || !race.hedges.is_empty();
            if !in_flight {
                let more = !race.stopped && (race.admitted || race.due || !this.timer.is_idle());
                if !more {
                    return match race.last.take().map(|last| *last) {
                        Some((out, class)) => Poll::Ready(race.hand_back(out, class)),
                        // Polled again after it finished.
                        None => Poll::Pending,
                    };
                }
            } else if race.first_started.is_none() {
                // The first attempt did not answer at once: from now on it is measured, and
                // the first hedge is due after the delay.
                let now = Instant::now();
                race.first_started = Some(now);
                // A budget of its own counts the calls that could be hedged: a call answered
                // on its first poll never could.
                if race.owns_budget()
                    && let Some(budget) = race.budget()
                {
                    budget.deposit_at(now);
                }
                if this.timer.is_idle() && !race.due && !race.stopped {
                    let delay = race.shared.config.delay.current();
                    // No timer for a hedge that could not be admitted when it fires.
                    let fits = race
                        .deadline_left(now)
                        .is_none_or(|left| left >= delay.saturating_add(race.need()));
                    if fits {
                        let at = later(now, delay);
                        this.timer.set(Timer::Armed {
                            sleep: tokio::time::sleep_until(at),
                        });
                        // Register the timer's waker; a zero delay is due at once.
                        if let TimerProj::Armed { sleep } = this.timer.as_mut().project()
                            && sleep.poll(cx).is_ready()
                        {
                            this.timer.set(Timer::Idle);
                            race.due = true;
                            continue;
                        }
                    }
                }
            }
            return Poll::Pending;
        }
    }
}

impl Timer {
    fn is_idle(&self) -> bool {
        matches!(self, Timer::Idle)
    }
}

impl<S, Req, M, T> Race<S, Req, M>
where
    S: Service<Req> + Clone,
    S::Error: IntoError<Transport = T>,
    S::Response: Envelope,
    Req: Envelope + Clone,
    M: MakeClassifier<Req>,
    M::Classifier: Classify<S::Response, Error<T>>,
{
    /// Classifies a finished attempt, learns its latency if it succeeded, and keeps it if it
    /// failed.
    fn judge(
        &mut self,
        out: Output<S, Req>,
        classifier: Option<M::Classifier>,
        started: Option<Instant>,
    ) -> Verdict<Output<S, Req>> {
        let Some(classifier) = classifier else {
            return Verdict::Win(out);
        };
        let classification: Classification = match &out {
            Ok(res) => classifier.classify_response(res).at_head(),
            Err(e) => classifier.classify_error(e, DeliveryPhase::Sent),
        };
        let class = classification.class();
        self.tally.observe(class);
        if self.owns_budget()
            && let Some(budget) = self.budget()
        {
            budget.record_outcome(class);
        }
        let config = &*self.shared.config;
        // An answer on the first poll is not learned from: the delay only ever applies to
        // attempts that did not answer at once, so it is their percentile that bounds the share
        // of them that get hedged (and the fast path reads no clock).
        if let (AttemptClass::Success, Some(started)) = (class, started)
            && let Some(learned) = config.delay.learns()
        {
            learned.record(started.elapsed());
        }
        if !class.is_health_failure() {
            return Verdict::Win(out);
        }
        self.forget_last();
        self.last = Some(Box::new((out, class)));
        Verdict::Lose(classification.pushback())
    }

    /// The race's last failure is the call's result: when copies were sent, with what they
    /// came to.
    fn hand_back(&self, mut out: Output<S, Req>, class: AttemptClass) -> Output<S, Req> {
        if self.sent > 1 {
            let outcome = self.tally.outcome().unwrap_or(Outcome::Failed);
            let stop = class.stop_reason(self.tally.semantics());
            CallOutcome::hand_back(&mut out, outcome, stop, self.sent, None, budget_left_now);
        }
        out
    }

    /// A failure that will not be the call's result: a budget kept by a retry layer outside
    /// hears of it here (the retry layer hears only of the result).
    fn forget_last(&mut self) {
        if let Some(class) = self.last.take().map(|last| last.1)
            && !self.owns_budget()
            && let Some(budget) = self.budget()
        {
            budget.record_outcome(class);
        }
    }

    /// An attempt failed: the next hedge is due now, after the server's pushback, or never.
    ///
    /// A pushback with no other attempt in flight ends the race with this failure: waiting for
    /// the server is the retry layer's job (it caps the pushback and knows the backoff), not a
    /// hedge's.
    fn failed(&mut self, pushback: Option<Pushback>, others: bool, mut timer: Pin<&mut Timer>) {
        match pushback {
            Some(Pushback::Stop) => {
                self.stopped = true;
                timer.set(Timer::Idle);
            }
            Some(Pushback::After(wait)) if !wait.is_zero() && !others => {
                self.stopped = true;
                timer.set(Timer::Idle);
            }
            Some(Pushback::After(wait)) if !wait.is_zero() => {
                self.due = false;
                let at = later(Instant::now(), wait);
                let later = match timer.as_mut().project() {
                    TimerProj::Armed { sleep } => sleep.deadline() < at,
                    TimerProj::Idle => true,
                };
                if later {
                    timer.set(Timer::Armed {
                        sleep: tokio::time::sleep_until(at),
                    });
                }
            }
            _ => self.due = true,
        }
    }

    /// Sends a hedge if the limit, the deadline and the budget allow it and the service is
    /// ready: `Ready(true)` if sent, `Ready(false)` if refused for good, `Pending` while the
    /// service is not ready.
    fn send(&mut self, cx: &mut TaskContext<'_>) -> Poll<bool> {
        if !self.admitted {
            if let Err(why) = self.admit() {
                tracing::debug!(attempts = self.sent, "no hedge: {why}");
                self.stopped = true;
                self.due = false;
                return Poll::Ready(false);
            }
            self.admitted = true;
        }
        // The clone kept when it was not ready, or a new one from the shared copy.
        let mut service = match self.readying.take() {
            Some(service) => *service,
            None => self.shared.service.service(),
        };
        match service.poll_ready(cx) {
            Poll::Pending => {
                self.readying = Some(Box::new(service));
                return Poll::Pending;
            }
            Poll::Ready(Err(_)) => {
                tracing::debug!(attempts = self.sent, "no hedge: the service failed");
                self.stopped = true;
                self.admitted = false;
                self.due = false;
                return Poll::Ready(false);
            }
            Poll::Ready(Ok(())) => {}
        }
        self.admitted = false;
        self.due = false;
        self.sent += 1;
        let req = self.template.clone();
        let classifier = self.shared.config.classifier.make_classifier(&req);
        let started = Instant::now();
        let future = crate::context::as_hedge(|| service.call(req));
        self.hedges.push(Attempt {
            future: Box::pin(future),
            classifier: Some(classifier),
            started,
        });
        Poll::Ready(true)
    }

    /// Whether one more hedge may be sent: within the attempt limit, with enough of the
    /// deadline left, and with the budget's consent (withdrawn last, as it counts).
    fn admit(&self) -> Result<(), &'static str> {
        let config = &*self.shared.config;
        if self.sent >= config.max_attempts {
            return Err("attempt limit reached");
        }
        if let Some(left) = crate::deadline::left_at(self.template.deadline(), Instant::now)
            && left < self.need()
        {
            return Err("too little of the deadline left");
        }
        if let Some(budget) = self.budget()
            && budget.withdraw().is_err()
        {
            return Err("the budget refused");
        }
        Ok(())
    }

    /// The budget hedges are paid from: the one a retry layer outside lent the call, else the
    /// layer's own.
    #[inline]
    fn budget(&self) -> Option<&Arc<dyn RetryBudget>> {
        self.lent.as_ref().or(self.shared.config.budget.as_ref())
    }

    /// Whether this layer deposits for the call and records every attempt's outcome (a budget
    /// of its own), or only withdraws (a budget a retry layer outside keeps, given or lent).
    #[inline]
    fn owns_budget(&self) -> bool {
        self.lent.is_none() && self.shared.config.owns_budget
    }

    /// The least time a hedge needs: the configured minimum, or the learned median latency.
    fn need(&self) -> Duration {
        let config = &*self.shared.config;
        config
            .delay
            .typical()
            .map_or(config.min_attempt, |t| t.max(config.min_attempt))
    }

    /// The call's budget left at `now`: the earlier of the current deadline and the request's.
    fn deadline_left(&self, now: Instant) -> Option<Duration> {
        crate::deadline::left_at(self.template.deadline(), || now)
    }

    /// The race is won: cancels the others and returns the winner's result.
    fn finish(
        &mut self,
        out: Output<S, Req>,
        mut first: Pin<&mut Slot<S::Future>>,
    ) -> Output<S, Req> {
        self.forget_last();
        let out = match self.tally.outcome() {
            // The winner was classified: a hedged call hands back what its copies came to.
            Some(outcome) if self.sent > 1 => {
                let mut out = out;
                let stop = match outcome {
                    Outcome::Succeeded => StopReason::Success,
                    _ => StopReason::NotRetried,
                };
                CallOutcome::hand_back(&mut out, outcome, stop, self.sent, None, budget_left_now);
                out
            }
            _ => out,
        };
        let losers = matches!(*first, Slot::Running { .. }) || !self.hedges.is_empty();
        if losers {
            // The call's record keeps the winner as its last attempt, not a cancelled loser.
            let last = CallTally::update(|t| t.last).flatten();
            first.set(Slot::Done);
            self.hedges.clear();
            if let Some(last) = last {
                CallTally::update(|t| t.last = Some(last));
            }
        }
        out
    }
}

impl<S, Req, M> fmt::Debug for ResponseFuture<S, Req, M>
where
    S: Service<Req>,
    S::Error: IntoError,
    M: MakeClassifier<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ResponseFuture");
        if let Some(race) = &self.race {
            d.field("sent", &race.sent)
                .field("in_flight", &race.hedges.len());
        } else {
            d.field("hedged", &false);
        }
        d.finish_non_exhaustive()
    }
}
