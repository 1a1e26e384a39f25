//! Which fault a request gets.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Fault;
use crate::ConfigError;

/// Chooses the fault, if any, for each request.
///
/// An [`InjectFault`](super::InjectFault) asks its policy once for every request, in the order
/// of the `call`s, even when the request carries its own [`Fault`] extension (which then wins);
/// so "the third request" always means the third request through the layer.
///
/// The policy takes `&self`: services are cloned (hyper clones one per connection, tower's
/// `Buffer` and `Retry` clone theirs), and the clones must share one script. The provided
/// policies share their state through an `Arc`; a policy of your own keeps its state in
/// atomics or a mutex.
///
/// Implemented by:
/// * [`Schedule`]: a fixed script by request index;
/// * [`Seeded`]: each request independently, with given probabilities, from a seeded RNG;
/// * closures `Fn(&Req) -> Option<Fault>`;
/// * `()`: never, so that only the requests' own [`Fault`] extensions inject anything.
///
/// ```
/// use surely::fault::{Fault, FaultPolicy};
///
/// // Refuse every DELETE, as if a firewall dropped them.
/// let policy = |req: &http::Request<()>| {
///     (req.method() == http::Method::DELETE).then_some(Fault::RefuseBeforeSend)
/// };
/// let delete = http::Request::delete("/orders/o-1").body(()).unwrap();
/// assert_eq!(policy.fault(&delete), Some(Fault::RefuseBeforeSend));
/// ```
pub trait FaultPolicy<Req> {
    /// The fault for this request, or `None` to pass it through untouched.
    fn fault(&self, req: &Req) -> Option<Fault>;
}

impl<Req> FaultPolicy<Req> for () {
    fn fault(&self, _: &Req) -> Option<Fault> {
        None
    }
}

impl<F, Req> FaultPolicy<Req> for F
where
    F: Fn(&Req) -> Option<Fault>,
{
    fn fault(&self, req: &Req) -> Option<Fault> {
        self(req)
    }
}

/// A fixed script: the request with index `i` (the first request through the layer has index
/// 0) gets the fault scripted for `i`, or the [`otherwise`](Schedule::otherwise) fault, or none.
///
/// Clones share the request counter, so a schedule given to a layer counts every request through
/// every clone of the service, in the order of their `call`s.
///
/// ```
/// use http::StatusCode;
/// use surely::fault::{Fault, FaultPolicy, Schedule};
///
/// // The second request commits and loses its reply; the fourth finds the server overloaded.
/// let schedule = Schedule::new()
///     .at(1, Fault::ResetAfterSend)
///     .at(3, Fault::Respond(StatusCode::SERVICE_UNAVAILABLE.into()));
///
/// let req = ();
/// let faults: Vec<_> = (0..5).map(|_| schedule.fault(&req)).collect();
/// assert_eq!(faults[0], None);
/// assert_eq!(faults[1], Some(Fault::ResetAfterSend));
/// assert_eq!(faults[2], None);
/// assert!(matches!(faults[3], Some(Fault::Respond(_))));
/// assert_eq!(faults[4], None);
/// assert_eq!(schedule.seen(), 5);
///
/// // A list, one entry per request: the first two are refused, then the server is back.
/// let outage: Schedule = [Some(Fault::RefuseBeforeSend), Some(Fault::RefuseBeforeSend)]
///     .into_iter()
///     .collect();
/// # assert_eq!(outage.fault(&req), Some(Fault::RefuseBeforeSend));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    script: Arc<Script>,
    next: Arc<AtomicU64>,
}

#[derive(Clone, Debug, Default)]
struct Script {
    at: BTreeMap<u64, Option<Fault>>,
    otherwise: Option<Fault>,
}

impl Schedule {
    /// A schedule that injects nothing until told to.
    pub fn new() -> Self {
        Self::default()
    }

    /// This schedule with `fault` for the request with this index (0 for the first request):
    /// a [`Fault`], or `None` to exempt that request from the [`otherwise`](Self::otherwise)
    /// fault. A later call for the same index replaces the earlier one.
    pub fn at(mut self, index: u64, fault: impl Into<Option<Fault>>) -> Self {
        Arc::make_mut(&mut self.script)
            .at
            .insert(index, fault.into());
        self
    }

    /// This schedule with `fault` for every request the script does not mention, e.g. an outage
    /// from some request on: `Schedule::new().otherwise(Fault::RefuseBeforeSend).at(0, None)`
    /// lets the first request through and refuses the rest.
    pub fn otherwise(mut self, fault: impl Into<Option<Fault>>) -> Self {
        Arc::make_mut(&mut self.script).otherwise = fault.into();
        self
    }

    /// How many requests this schedule (and its clones) has been asked about.
    pub fn seen(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    fn fault_at(&self, index: u64) -> Option<Fault> {
        match self.script.at.get(&index) {
            Some(fault) => fault.clone(),
            None => self.script.otherwise.clone(),
        }
    }
}

/// The request with index `i` gets the `i`-th item; requests past the end pass.
impl FromIterator<Option<Fault>> for Schedule {
    fn from_iter<I: IntoIterator<Item = Option<Fault>>>(iter: I) -> Self {
        let at = (0u64..).zip(iter).collect();
        Schedule {
            script: Arc::new(Script {
                at,
                otherwise: None,
            }),
            next: Arc::default(),
        }
    }
}

impl<Req> FaultPolicy<Req> for Schedule {
    fn fault(&self, _: &Req) -> Option<Fault> {
        self.fault_at(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// Random faults from a seeded RNG: each request independently gets each fault with its
/// probability, and passes with what is left.
///
/// Every request draws exactly one number, so the sequence of faults depends only on the seed
/// and the order of the requests: a chaos test that fails can be replayed with the seed it
/// logged. (The generator is `rand`'s `SmallRng`: the sequence for a seed is the same from run
/// to run, but may change with the platform's word size or a new `rand` version.) Clones share
/// the generator.
///
/// ```
/// use surely::fault::{Fault, FaultPolicy, Seeded};
///
/// # fn main() -> Result<(), surely::ConfigError> {
/// // 10% of requests lose their reply after committing, 5% are refused.
/// let faults = [(0.10, Fault::ResetAfterSend), (0.05, Fault::RefuseBeforeSend)];
/// let a = Seeded::new(42, faults.clone())?;
/// let b = Seeded::new(42, faults)?;
/// for _ in 0..100 {
///     assert_eq!(a.fault(&()), b.fault(&()));
/// }
///
/// // Probabilities are checked, never trusted.
/// assert!(Seeded::new(42, [(f64::NAN, Fault::ResetAfterSend)]).is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Seeded {
    /// Each fault with its upper bound: the fault whose bound is the first above the draw wins.
    thresholds: Arc<[(f64, Fault)]>,
    rng: Arc<Mutex<SmallRng>>,
}

/// How far from 1 the sum of the probabilities may be, for rounding: `0.1 + 0.2 + 0.7` is
/// `1.0000000000000002`, and `0.7 + 0.2 + 0.1` is `0.9999999999999999`.
const SUM_TOLERANCE: f64 = 1e-9;

impl Seeded {
    /// A policy that draws from a generator seeded with `seed`, giving each fault its
    /// probability.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if a probability is NaN, infinite, below 0 or above 1, or if the
    /// probabilities add up to more than 1 (allowing for rounding).
    ///
    /// ```
    /// use surely::fault::{Fault, Seeded};
    ///
    /// let err = Seeded::new(7, [(1.5, Fault::RefuseBeforeSend)]).unwrap_err();
    /// assert_eq!(err.to_string(), "invalid fault probability: must be a number in [0, 1]");
    ///
    /// let err = Seeded::new(7, [(0.6, Fault::RefuseBeforeSend), (0.6, Fault::ResetAfterSend)])
    ///     .unwrap_err();
    /// assert_eq!(err.to_string(), "invalid fault probabilities: must add up to at most 1");
    /// ```
    pub fn new(
        seed: u64,
        faults: impl IntoIterator<Item = (f64, Fault)>,
    ) -> Result<Self, ConfigError> {
        let mut sum = 0.0;
        let mut thresholds = Vec::new();
        for (p, fault) in faults {
            if !(0.0..=1.0).contains(&p) {
                return Err(ConfigError::new(
                    "fault probability",
                    "must be a number in [0, 1]",
                ));
            }
            sum += p;
            thresholds.push((sum, fault));
        }
        if sum > 1.0 + SUM_TOLERANCE {
            return Err(ConfigError::new(
                "fault probabilities",
                "must add up to at most 1",
            ));
        }
        // Probabilities meant to add up to 1 cover every draw, whatever the rounding.
        for (bound, _) in &mut thresholds {
            if *bound >= 1.0 - SUM_TOLERANCE {
                *bound = 1.0;
            }
        }
        Ok(Seeded {
            thresholds: thresholds.into(),
            rng: Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))),
        })
    }

    fn draw(&self) -> f64 {
        // A panic while the lock was held cannot leave the generator half-updated in a way that
        // matters here: keep drawing.
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        rng.random::<f64>()
    }
}

impl<Req> FaultPolicy<Req> for Seeded {
    fn fault(&self, _: &Req) -> Option<Fault> {
        let draw = self.draw();
        self.thresholds
            .iter()
            .find(|(bound, _)| draw < *bound)
            .map(|(_, fault)| fault.clone())
    }
}
