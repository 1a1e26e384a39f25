//! Exhaustive models of three of the crate's protocols, checked with `stateright`:
//!
//! * [`key`]: the server's key protocol (the idempotency layer and its store: leases on the
//!   store's clock, fences, checkpoints, takeover, the recovery hook or its rule, the settler of
//!   `UNKNOWN` records), with owners that pause, crash and are dropped, and a client that resends
//!   over a network that loses and duplicates;
//! * [`relay`]: the outbox's relay (claim with a lease, publish, mark) and the consumer's inbox
//!   (the effect and the event id in one transaction, then the acknowledgement), with crashes at
//!   every step;
//! * [`queue`]: the leased work queue under the ledger, the reconciliation differences and the
//!   outbox (claims with a lease and a fence, holders' fenced writes, waits, the manual state, a
//!   person's reopenings and settlements, the sweep), with holders that pause past their lease,
//!   crash, and whose writes arrive twice.
//!
//! Each model is checked breadth first over **every** state it can reach within its bounds (its
//! own counters: how many crashes, losses, duplicates, pauses; the models have no cycles, so the
//! search ends by itself), and each test prints how many states it visited. Each model also has
//! knobs that break the protocol on purpose (a mutation: drop the fence check, acknowledge before
//! the commit, ...), and a test per mutation asserts that the checker finds the counterexample.
//!
//! What the models prove, to which bounds, and what they do not cover: the docs chapter `docs::how_we_know` (`src/docs/how_we_know.md`).
//! Run them with `cargo test --test models protocols:: -- --nocapture`.
//!
//! A crate of the workspace of its own (`surely-protocols`), built optimised even in a debug
//! build (`[profile.dev.package.surely-protocols]` in the workspace's `Cargo.toml`): the checker's
//! code is generic over the models, so it is compiled here, and unoptimised it took three
//! minutes of the tests' time. Each check is a public function; the crate's test binary
//! `tests/models` runs each one as a test of the same name.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model};

/// Checks `model` exhaustively (breadth first, on two threads), prints what the search covered,
/// and returns the checker. With `stop_at`, the search stops at that property's first discovery.
fn check<M>(label: &str, model: M, stop_at: Option<&'static str>) -> impl Checker<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + Debug + 'static,
    M::Action: Clone + PartialEq + Debug,
{
    let started = Instant::now();
    let mut builder = model.checker().threads(2);
    if let Some(property) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf([property].into()));
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "{label}: {} states visited ({} distinct), depth {}, in {:.2?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}

/// Prints the checker's counterexample to `property`, state by state.
fn counterexample<M, C>(checker: &C, property: &'static str)
where
    M: Model,
    M::State: Clone + PartialEq + Debug,
    M::Action: Clone + PartialEq + Debug,
    C: Checker<M>,
{
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("no counterexample to \"{property}\""));
    println!("counterexample to \"{property}\", from the initial state:");
    for (state, action) in path.into_vec() {
        println!("    {state:?}");
        if let Some(action) = action {
            println!("  {action:?}");
        }
    }
}

/// Asserts that no state of `model` reaches itself again (a depth-first search over every
/// state), and returns how many states it has. Stateright checks an `eventually` property on
/// the paths that end in a state with no successor, and cannot see a path that loops for ever:
/// on a model without cycles, every path ends, so none is missed.
fn assert_acyclic<M>(label: &str, model: &M) -> usize
where
    M: Model,
    M::State: Hash + Eq + Clone + Debug,
{
    // A state maps to `false` while it is on the search's stack, to `true` once all it leads
    // to is searched.
    let mut searched: std::collections::HashMap<M::State, bool> = Default::default();
    for init in model.init_states() {
        if searched.contains_key(&init) {
            continue;
        }
        searched.insert(init.clone(), false);
        let next = model.next_states(&init);
        let mut stack = vec![(init, next)];
        while let Some((_, successors)) = stack.last_mut() {
            match successors.pop() {
                Some(next) => match searched.get(&next) {
                    Some(false) => panic!("{label}: a cycle through {next:?}"),
                    Some(true) => {}
                    None => {
                        searched.insert(next.clone(), false);
                        let successors = model.next_states(&next);
                        stack.push((next, successors));
                    }
                },
                None => {
                    let (state, _) = stack.pop().expect("the stack is not empty");
                    searched.insert(state, true);
                }
            }
        }
    }
    println!("{label}: no cycle in {} states", searched.len());
    searched.len()
}

pub(crate) mod key {
    //! The server's key protocol, one key.
    //!
    //! **What it abstracts.** One keyed request (one key, one body: a payment) and the layer's
    //! record of it in the store ([`Record`]: its state, its fence, whether its lease still
    //! holds, and the channel request id its owners checkpointed). Each store operation is one
    //! atomic step, as the store's contract says: `acquire` (a new record, a replay, `409` while
    //! the lease holds, `202` for an `UNKNOWN` record, a takeover once the lease passed, a new
    //! owner after a release), `checkpoint`, `complete`, `release` and `mark_unknown`, each
    //! refused unless the caller's fence is the record's (the fence check the `fence_check`
    //! mutation drops).
    //!
    //! * **Time** is the store's clock only, and only what the store compares: a lease that holds
    //!   or has passed. The lease of a live owner passes at any moment, up to `pauses` times: that
    //!   is an owner that paused (a GC pause, a slow network) longer than its lease, and resumes
    //!   later with its old fence. A lease whose owner is gone (crashed, dropped, failed) always
    //!   passes eventually. Renewal is not modelled: a renewal only keeps a lease from passing,
    //!   and the model lets any lease pass or not at any moment already.
    //! * **Owners** (`owners`, 2 or 3) are the server's workers: an idle one takes a request off
    //!   the network and acquires the key. The handler, as the docs tell it to be written,
    //!   reuses the channel request id an earlier owner checkpointed, or makes a new one (its
    //!   fence) and checkpoints it **before** it calls the channel; then it calls the channel (the
    //!   external effect: a payment), then completes the record and answers. A stale checkpoint
    //!   or a refused channel call fails the handler (`5xx`); a stale completion still answers
    //!   (as the layer does). An owner crashes (its work lost, up to `crashes` times) or is
    //!   dropped with its client (up to `drops` times: the layer's guard then releases the key
    //!   if the handler recorded no checkpoint) at any step.
    //! * **Recovery** on a takeover: with the hook ([`Recovery::Hook`]), a record without
    //!   checkpoints resumes, and one with a checkpoint asks the channel: done, the answer is
    //!   stored (`Completed`); not done, resume with the checkpointed id, or the channel cannot
    //!   tell (`Unknown`). Without a hook ([`Recovery::Rule`]), the layer's rule: no checkpoint
    //!   resumes, a checkpoint makes the record `UNKNOWN`.
    //! * **The settler** (the reconciler's `settle_unknowns`) asks the channel about an `UNKNOWN`
    //!   record's checkpointed id: done completes the record with the answer; not done voids the
    //!   id at the channel (so that nothing can use it any more) and releases the record. The
    //!   void is this model's, not the docs': a settler that only asks is unsafe (see
    //!   `key_settling_by_asking_alone_charges_twice`).
    //! * **The channel** (the payment provider) executes a request id once: a second call with
    //!   the same id replays the first (as a payment API's idempotency key does); a voided id is
    //!   refused.
    //! * **The client** sends once, and resends with the same key: after a `409` once its
    //!   `Retry-After` passed (the lease it was told about passed, or the record moved on), after
    //!   a `5xx`, after a timeout when nothing of its call is left anywhere (a lost message, a
    //!   crashed owner), and up to `impatient` times at any moment (a timeout while an owner
    //!   still works). It ends on the first answer or `202 UNKNOWN`.
    //! * **The network** delivers requests and replies in any order, and loses (`losses`) or
    //!   duplicates (`dups`) any of them.
    //!
    //! **What it checks.** Always: at most one external effect (the channel executed at most one
    //! request for the key); a stale owner never completes the record; an answer the client gets
    //! is true (the payment it reports was made). Eventually (on every path to a state where
    //! nothing more can happen): the client ends with an answer or `UNKNOWN`. Sometimes (that the
    //! model reaches what it is about): a takeover, a resume with the checkpointed id, a stale
    //! owner refused, an `UNKNOWN` record settled, the client answered, the client told
    //! `UNKNOWN`.
    //!
    //! **Bounds** ([`KeyProtocol::default`]): one key, one client, two owners (and three, in a
    //! test of its own); the network loses up to 2 messages and duplicates 1; the client
    //! resends early once, besides every resend it has a reason for; a live owner's lease passes
    //! up to 3 times; owners crash up to 2 times; 1 handler is dropped. The settler, and the
    //! channel that cannot tell, are not bounded. No depth bound: the counters bound every path
    //! (the model has no cycles: `the_models_have_no_cycles`). Workers are alike, so the state
    //! keeps them sorted (one order stands for all): in a printed trace, `Checkpoint(1)` is the
    //! worker at position 1 of the state before it.
    //!
    //! **Mutations**, each a knob, each caught by a test: no fence check (a stale owner completes;
    //! two effects), calling the channel before the checkpoint (two effects), a blind rerun on a
    //! takeover (two effects), a guard that releases a dropped handler's key after its checkpoint
    //! (two effects). Two more knobs show what the protocol needs from outside the crate: a
    //! channel that honours its request id, and a settler whose "it did not happen" is final.
    //!
    //! **What it does not cover.** Real time (lease lengths, deadlines, the `Retry-After`
    //! value), the store's implementations (the model is the store's contract, not the memory
    //! or PostgreSQL code), other keys and other bodies (`422`), retention, expiry and the sweep
    //! (`410`), renewal, the rebuild hook, several checkpoints per handler, a handler that
    //! completes the record in its own transaction, a channel that executes a request id twice
    //! or answers for an id it never saw, recovery verdicts of `Failed`, and the client's own
    //! layers (its retry budget, deadline and journal).

    use stateright::{Model, Property};

    /// The channel's ids are the owners' fences, in a `u16` bit set: fences up to 15 (the bounds
    /// stay far below).
    const MAX_FENCE: u8 = 15;

    /// What a takeover does with the previous owner's work.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Recovery {
        /// The recovery hook: asks the channel about the checkpointed id.
        Hook,
        /// No hook: the layer's rule (no checkpoint resumes, a checkpoint is `UNKNOWN`).
        Rule,
        /// Mutation: the handler reruns blindly, with a new channel request id.
        Blind,
    }

    /// The model's bounds and knobs. [`KeyProtocol::default`] is the protocol as documented, with
    /// the bounds the tests check.
    #[derive(Clone, Debug)]
    pub(crate) struct KeyProtocol {
        /// Server workers (owners): 2 or 3.
        pub(crate) owners: usize,
        /// Resends on a timeout while something of the call is still in flight.
        pub(crate) impatient: u8,
        /// Messages the network loses.
        pub(crate) losses: u8,
        /// Messages the network duplicates.
        pub(crate) dups: u8,
        /// Times a live owner's lease passes (the owner paused past it).
        pub(crate) pauses: u8,
        /// Owner crashes.
        pub(crate) crashes: u8,
        /// Handlers dropped with their client.
        pub(crate) drops: u8,
        /// The store refuses a write whose fence is not the record's. Mutation: `false`.
        pub(crate) fence_check: bool,
        /// The handler checkpoints its channel request id before it calls the channel.
        /// Mutation: `false` (it calls, then checkpoints).
        pub(crate) checkpoint_first: bool,
        /// What a takeover does.
        pub(crate) recovery: Recovery,
        /// A dropped handler's guard releases the key only if the handler recorded no
        /// checkpoint (and its ticket came with none). Mutation: `false` (it always releases).
        pub(crate) guard_checks_checkpoints: bool,
        /// The settler voids the id at the channel before it releases a record as "did not
        /// happen". `false`: it only asks (see the finding in the docs).
        pub(crate) settle_voids: bool,
        /// The channel executes a request id once. `false`: every call executes (an assumption
        /// the protocol needs, shown by a test).
        pub(crate) channel_dedups: bool,
    }

    impl Default for KeyProtocol {
        fn default() -> Self {
            KeyProtocol {
                owners: 2,
                impatient: 1,
                losses: 2,
                dups: 1,
                pauses: 3,
                crashes: 2,
                drops: 1,
                fence_check: true,
                checkpoint_first: true,
                recovery: Recovery::Hook,
                guard_checks_checkpoints: true,
                settle_voids: true,
                channel_dedups: true,
            }
        }
    }

    /// The record's state in the store.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Stage {
        /// No record.
        Absent,
        /// Owned; `lease`: whether the owner's lease still holds on the store's clock.
        Processing { lease: bool },
        /// An answer is stored (SUCCEEDED, FAILED_FINAL).
        Completed,
        /// Not processed: the next request runs.
        Released,
        /// The outcome is unknown: `202` until settled.
        Unknown,
    }

    /// The key's record.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Record {
        pub(crate) stage: Stage,
        pub(crate) fence: u8,
        /// The channel request id an owner checkpointed; a release drops it.
        pub(crate) checkpoint: Option<u8>,
    }

    /// The external system (a payment channel).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Channel {
        /// The request ids it executed (bit per id).
        pub(crate) done: u16,
        /// The ids a settler voided.
        pub(crate) voided: u16,
        /// External effects: executions (payments made).
        pub(crate) effects: u8,
    }

    /// What a recovery decided, to store.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Verdict {
        /// The work was done: complete the record with the answer.
        Completed,
        /// Nobody can tell: mark the record `UNKNOWN`.
        Unknown,
    }

    /// A server worker.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Owner {
        Idle,
        /// Took the record over with a checkpoint: the hook asks the channel.
        Asking {
            fence: u8,
            checkpoint: u8,
        },
        /// Recovery decided; the decision is stored next.
        Deciding {
            fence: u8,
            verdict: Verdict,
        },
        /// The handler runs with channel request id `id`.
        Handling {
            fence: u8,
            id: u8,
            /// The record holds the id (this handler checkpointed it, or found it).
            recorded: bool,
            /// The channel was called.
            called: bool,
            /// The ticket came with an earlier owner's checkpoints.
            previous: bool,
        },
        /// A dropped handler's guard releases the key (a task of its own).
        Releasing {
            fence: u8,
        },
    }

    impl Owner {
        /// The fence this worker holds, if busy.
        fn fence(&self) -> Option<u8> {
            match *self {
                Owner::Idle => None,
                Owner::Asking { fence, .. }
                | Owner::Deciding { fence, .. }
                | Owner::Handling { fence, .. }
                | Owner::Releasing { fence } => Some(fence),
            }
        }
    }

    /// A reply on its way to the client.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Reply {
        /// The answer (fresh or replayed): "paid".
        Answer,
        /// `202` `IDEMPOTENCY_OUTCOME_UNKNOWN`.
        Unknown,
        /// `409`: in flight, under the owner with this fence.
        InFlight(u8),
        /// `5xx`: the handler failed.
        Error,
    }

    /// How the client's call ended.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Outcome {
        Waiting,
        Answered,
        Unknown,
    }

    /// Why the client may resend now.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Retry {
        No,
        /// After a `409` from the owner with this fence: once that lease passed.
        AfterInFlight(u8),
        /// After a `5xx`.
        AfterError,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Client {
        pub(crate) outcome: Outcome,
        pub(crate) retry: Retry,
    }

    /// The reconciler settling `UNKNOWN` records.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Settler {
        Idle,
        /// Asked the channel about the record owned with `fence`.
        Settling {
            fence: u8,
            happened: bool,
        },
    }

    /// The faults left to inject.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Budget {
        impatient: u8,
        losses: u8,
        dups: u8,
        pauses: u8,
        crashes: u8,
        drops: u8,
    }

    /// Things seen on the way (monotone), for the `sometimes` properties.
    pub(crate) mod seen {
        pub(crate) const TAKEOVER: u8 = 1;
        pub(crate) const RESUMED: u8 = 2;
        pub(crate) const STALE_REFUSED: u8 = 4;
        pub(crate) const SETTLED: u8 = 8;
    }

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    pub(crate) struct State {
        pub(crate) record: Record,
        pub(crate) channel: Channel,
        pub(crate) owners: Vec<Owner>,
        pub(crate) settler: Settler,
        pub(crate) client: Client,
        /// Requests in flight (all alike: one key, one body).
        pub(crate) requests: u8,
        /// Replies in flight, sorted.
        pub(crate) replies: Vec<Reply>,
        pub(crate) budget: Budget,
        pub(crate) seen: u8,
        /// Ghost: the store accepted a completion from an owner whose fence was not the
        /// record's.
        pub(crate) stale_completed: bool,
    }

    impl State {
        fn reply(&mut self, reply: Reply) {
            let at = self.replies.partition_point(|r| *r < reply);
            self.replies.insert(at, reply);
        }

        fn unreply(&mut self, reply: Reply) -> bool {
            match self.replies.iter().position(|r| *r == reply) {
                Some(at) => {
                    self.replies.remove(at);
                    true
                }
                None => false,
            }
        }

        /// Whether a live worker holds `fence`.
        fn held_by_live_owner(&self, fence: u8) -> bool {
            self.owners.iter().any(|o| o.fence() == Some(fence))
        }

        /// Whether the client has a reason to resend now: the `Retry-After` of its `409` passed
        /// (that lease passed, or the record moved on), it got a `5xx`, or it is waiting for a
        /// reply and nothing of its call is left anywhere (no message, no busy worker: a lost
        /// message, a crashed or dropped owner).
        fn may_resend(&self) -> bool {
            match self.client.retry {
                Retry::No => {
                    self.requests == 0
                        && self.replies.is_empty()
                        && self.owners.iter().all(|o| *o == Owner::Idle)
                }
                Retry::AfterError => true,
                Retry::AfterInFlight(f) => {
                    !(self.record.fence == f
                        && self.record.stage == (Stage::Processing { lease: true }))
                }
            }
        }
    }

    /// A step of the system.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Action {
        /// A request reaches an idle worker, which acquires the key.
        Deliver,
        /// A reply reaches the client.
        Receive(Reply),
        LoseRequest,
        LoseReply(Reply),
        DuplicateRequest,
        DuplicateReply(Reply),
        /// The client sends the request again, same key.
        Resend,
        /// The store's clock passes the lease.
        LeasePasses,
        /// Worker `i`'s handler checkpoints its channel request id.
        Checkpoint(usize),
        /// Worker `i`'s handler calls the channel.
        Call(usize),
        /// Worker `i`'s handler completes the record and answers.
        Complete(usize),
        /// Worker `i`'s recovery hook asks the channel, and decides.
        Recover(usize, Hook),
        /// Worker `i` stores its recovery decision and answers.
        StoreVerdict(usize),
        /// Worker `i`'s guard releases the key of its dropped handler.
        Release(usize),
        /// Worker `i` crashes: its work is lost.
        Crash(usize),
        /// Worker `i`'s handler is dropped (its client went away).
        Drop(usize),
        /// The settler asks the channel about the `UNKNOWN` record.
        SettleAsk,
        /// The settler completes or releases the record.
        SettleStore,
    }

    /// What the hook makes of the channel's answer.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Hook {
        /// The channel executed the id: `Recovery::Completed`.
        Done,
        /// It did not: `Recovery::Resume`, with the checkpointed id.
        Resume,
        /// The channel cannot tell (unreachable): `Recovery::Unknown`.
        CannotTell,
    }

    fn bit(id: u8) -> u16 {
        1 << id
    }

    impl KeyProtocol {
        /// Whether a write with `fence` may change a record in `stage` (complete, release and
        /// settle: `PROCESSING` or `UNKNOWN`; checkpoint and mark_unknown: `PROCESSING`).
        fn may_write(&self, record: &Record, fence: u8, unknown_too: bool) -> bool {
            let stage_ok = match record.stage {
                Stage::Processing { .. } => true,
                Stage::Unknown => unknown_too,
                _ => false,
            };
            stage_ok && (!self.fence_check || record.fence == fence)
        }

        /// A new handler on worker `i` with `fence`: its channel request id is new.
        fn fresh(fence: u8) -> Owner {
            Owner::Handling {
                fence,
                id: fence,
                recorded: false,
                called: false,
                previous: false,
            }
        }

        /// A takeover of a record whose lease passed: what recovery makes of it.
        fn recover(&self, s: &mut State, i: usize) {
            let fence = s.record.fence;
            s.seen |= seen::TAKEOVER;
            s.owners[i] = match (self.recovery, s.record.checkpoint) {
                (Recovery::Blind, _) | (_, None) => Self::fresh(fence),
                (Recovery::Rule, Some(_)) => Owner::Deciding {
                    fence,
                    verdict: Verdict::Unknown,
                },
                (Recovery::Hook, Some(checkpoint)) => Owner::Asking { fence, checkpoint },
            };
        }

        /// A new owner's fence: the record's, plus one.
        fn next_fence(s: &mut State) -> u8 {
            assert!(s.record.fence < MAX_FENCE, "fence past the model's bound");
            s.record.fence += 1;
            s.record.fence
        }

        fn complete(&self, s: &mut State, fence: u8) {
            if self.may_write(&s.record, fence, true) {
                if s.record.fence != fence {
                    s.stale_completed = true;
                }
                s.record.stage = Stage::Completed;
            } else {
                s.seen |= seen::STALE_REFUSED;
            }
        }
    }

    impl Model for KeyProtocol {
        type State = State;
        type Action = Action;

        fn init_states(&self) -> Vec<State> {
            vec![State {
                record: Record {
                    stage: Stage::Absent,
                    fence: 0,
                    checkpoint: None,
                },
                channel: Channel {
                    done: 0,
                    voided: 0,
                    effects: 0,
                },
                owners: vec![Owner::Idle; self.owners],
                settler: Settler::Idle,
                client: Client {
                    outcome: Outcome::Waiting,
                    retry: Retry::No,
                },
                requests: 1,
                replies: Vec::new(),
                budget: Budget {
                    impatient: self.impatient,
                    losses: self.losses,
                    dups: self.dups,
                    pauses: self.pauses,
                    crashes: self.crashes,
                    drops: self.drops,
                },
                seen: 0,
                stale_completed: false,
            }]
        }

        fn actions(&self, s: &State, actions: &mut Vec<Action>) {
            let b = &s.budget;
            if s.requests > 0 {
                if s.owners.contains(&Owner::Idle) {
                    actions.push(Action::Deliver);
                }
                if b.losses > 0 {
                    actions.push(Action::LoseRequest);
                }
                if b.dups > 0 {
                    actions.push(Action::DuplicateRequest);
                }
            }
            let mut last = None;
            for &r in &s.replies {
                if last == Some(r) {
                    continue;
                }
                last = Some(r);
                actions.push(Action::Receive(r));
                if b.losses > 0 {
                    actions.push(Action::LoseReply(r));
                }
                if b.dups > 0 {
                    actions.push(Action::DuplicateReply(r));
                }
            }
            if s.client.outcome == Outcome::Waiting && (s.may_resend() || b.impatient > 0) {
                actions.push(Action::Resend);
            }
            if s.record.stage == (Stage::Processing { lease: true })
                && (b.pauses > 0 || !s.held_by_live_owner(s.record.fence))
            {
                actions.push(Action::LeasePasses);
            }
            for (i, o) in s.owners.iter().enumerate() {
                match *o {
                    Owner::Idle => continue,
                    Owner::Asking { checkpoint, .. } => {
                        if s.channel.done & bit(checkpoint) != 0 {
                            actions.push(Action::Recover(i, Hook::Done));
                        } else {
                            actions.push(Action::Recover(i, Hook::Resume));
                            actions.push(Action::Recover(i, Hook::CannotTell));
                        }
                    }
                    Owner::Deciding { .. } => actions.push(Action::StoreVerdict(i)),
                    Owner::Releasing { .. } => actions.push(Action::Release(i)),
                    Owner::Handling {
                        recorded, called, ..
                    } => {
                        if !recorded && (self.checkpoint_first || called) {
                            actions.push(Action::Checkpoint(i));
                        }
                        if !called && (recorded || !self.checkpoint_first) {
                            actions.push(Action::Call(i));
                        }
                        if recorded && called {
                            actions.push(Action::Complete(i));
                        }
                        if b.drops > 0 {
                            actions.push(Action::Drop(i));
                        }
                    }
                }
                if b.crashes > 0 {
                    actions.push(Action::Crash(i));
                }
            }
            match s.settler {
                Settler::Idle if s.record.stage == Stage::Unknown => {
                    actions.push(Action::SettleAsk)
                }
                Settler::Settling { .. } => actions.push(Action::SettleStore),
                Settler::Idle => {}
            }
        }

        fn next_state(&self, last: &State, action: Action) -> Option<State> {
            let mut s = last.clone();
            match action {
                Action::Deliver => {
                    s.requests -= 1;
                    let i = s.owners.iter().position(|o| *o == Owner::Idle)?;
                    match s.record.stage {
                        Stage::Absent => {
                            s.record = Record {
                                stage: Stage::Processing { lease: true },
                                fence: 1,
                                checkpoint: None,
                            };
                            s.owners[i] = Self::fresh(1);
                        }
                        Stage::Processing { lease: true } => {
                            s.reply(Reply::InFlight(s.record.fence))
                        }
                        Stage::Processing { lease: false } => {
                            Self::next_fence(&mut s);
                            s.record.stage = Stage::Processing { lease: true };
                            self.recover(&mut s, i);
                        }
                        Stage::Released => {
                            let fence = Self::next_fence(&mut s);
                            s.record.stage = Stage::Processing { lease: true };
                            s.owners[i] = Self::fresh(fence);
                        }
                        Stage::Completed => s.reply(Reply::Answer),
                        Stage::Unknown => s.reply(Reply::Unknown),
                    }
                }
                Action::Receive(r) => {
                    s.unreply(r);
                    if s.client.outcome == Outcome::Waiting {
                        match r {
                            Reply::Answer => s.client.outcome = Outcome::Answered,
                            Reply::Unknown => s.client.outcome = Outcome::Unknown,
                            Reply::InFlight(f) => s.client.retry = Retry::AfterInFlight(f),
                            Reply::Error => s.client.retry = Retry::AfterError,
                        }
                    }
                }
                Action::LoseRequest => {
                    s.requests -= 1;
                    s.budget.losses -= 1;
                }
                Action::LoseReply(r) => {
                    s.unreply(r);
                    s.budget.losses -= 1;
                }
                Action::DuplicateRequest => {
                    s.requests += 1;
                    s.budget.dups -= 1;
                }
                Action::DuplicateReply(r) => {
                    s.reply(r);
                    s.budget.dups -= 1;
                }
                Action::Resend => {
                    if !s.may_resend() {
                        s.budget.impatient -= 1;
                    }
                    s.client.retry = Retry::No;
                    s.requests += 1;
                }
                Action::LeasePasses => {
                    if s.held_by_live_owner(s.record.fence) {
                        s.budget.pauses -= 1;
                    }
                    s.record.stage = Stage::Processing { lease: false };
                }
                Action::Checkpoint(i) => {
                    let Owner::Handling {
                        fence,
                        id,
                        called,
                        previous,
                        ..
                    } = s.owners[i]
                    else {
                        return None;
                    };
                    if self.may_write(&s.record, fence, false) {
                        s.record.checkpoint = Some(id);
                        s.owners[i] = Owner::Handling {
                            fence,
                            id,
                            recorded: true,
                            called,
                            previous,
                        };
                    } else {
                        // Stale: the handler stops with an error.
                        s.seen |= seen::STALE_REFUSED;
                        s.owners[i] = Owner::Idle;
                        s.reply(Reply::Error);
                    }
                }
                Action::Call(i) => {
                    let Owner::Handling {
                        fence,
                        id,
                        recorded,
                        previous,
                        ..
                    } = s.owners[i]
                    else {
                        return None;
                    };
                    if s.channel.voided & bit(id) != 0 {
                        // The channel refuses a voided id: the handler fails.
                        s.owners[i] = Owner::Idle;
                        s.reply(Reply::Error);
                    } else {
                        if !(self.channel_dedups && s.channel.done & bit(id) != 0) {
                            s.channel.effects += 1;
                        }
                        s.channel.done |= bit(id);
                        s.owners[i] = Owner::Handling {
                            fence,
                            id,
                            recorded,
                            called: true,
                            previous,
                        };
                    }
                }
                Action::Complete(i) => {
                    let Owner::Handling { fence, .. } = s.owners[i] else {
                        return None;
                    };
                    self.complete(&mut s, fence);
                    // Refused or not, the handler's answer is its client's.
                    s.owners[i] = Owner::Idle;
                    s.reply(Reply::Answer);
                }
                Action::Recover(i, hook) => {
                    let Owner::Asking { fence, checkpoint } = s.owners[i] else {
                        return None;
                    };
                    s.owners[i] = match hook {
                        Hook::Done => Owner::Deciding {
                            fence,
                            verdict: Verdict::Completed,
                        },
                        Hook::CannotTell => Owner::Deciding {
                            fence,
                            verdict: Verdict::Unknown,
                        },
                        Hook::Resume => {
                            s.seen |= seen::RESUMED;
                            Owner::Handling {
                                fence,
                                id: checkpoint,
                                recorded: true,
                                called: false,
                                previous: true,
                            }
                        }
                    };
                }
                Action::StoreVerdict(i) => {
                    let Owner::Deciding { fence, verdict } = s.owners[i] else {
                        return None;
                    };
                    match verdict {
                        Verdict::Completed => {
                            self.complete(&mut s, fence);
                            s.reply(Reply::Answer);
                        }
                        Verdict::Unknown => {
                            if self.may_write(&s.record, fence, false) {
                                s.record.stage = Stage::Unknown;
                            } else {
                                s.seen |= seen::STALE_REFUSED;
                            }
                            s.reply(Reply::Unknown);
                        }
                    }
                    s.owners[i] = Owner::Idle;
                }
                Action::Release(i) => {
                    let Owner::Releasing { fence } = s.owners[i] else {
                        return None;
                    };
                    if self.may_write(&s.record, fence, true) {
                        s.record.stage = Stage::Released;
                        s.record.checkpoint = None;
                    } else {
                        s.seen |= seen::STALE_REFUSED;
                    }
                    s.owners[i] = Owner::Idle;
                }
                Action::Crash(i) => {
                    s.owners[i] = Owner::Idle;
                    s.budget.crashes -= 1;
                }
                Action::Drop(i) => {
                    let Owner::Handling {
                        fence,
                        recorded,
                        previous,
                        ..
                    } = s.owners[i]
                    else {
                        return None;
                    };
                    s.budget.drops -= 1;
                    // The guard releases only a key whose handler recorded no step; otherwise
                    // the record waits for its lease and a takeover's recovery.
                    s.owners[i] = if self.guard_checks_checkpoints && (recorded || previous) {
                        Owner::Idle
                    } else {
                        Owner::Releasing { fence }
                    };
                }
                Action::SettleAsk => {
                    let happened = match s.record.checkpoint {
                        Some(id) => s.channel.done & bit(id) != 0,
                        None => false,
                    };
                    if let (false, true, Some(id)) =
                        (happened, self.settle_voids, s.record.checkpoint)
                    {
                        s.channel.voided |= bit(id);
                    }
                    s.settler = Settler::Settling {
                        fence: s.record.fence,
                        happened,
                    };
                }
                Action::SettleStore => {
                    let Settler::Settling { fence, happened } = s.settler else {
                        return None;
                    };
                    if s.record.stage == Stage::Unknown && self.may_write(&s.record, fence, true) {
                        if happened {
                            s.record.stage = Stage::Completed;
                        } else {
                            s.record.stage = Stage::Released;
                            s.record.checkpoint = None;
                        }
                        s.seen |= seen::SETTLED;
                    }
                    s.settler = Settler::Idle;
                }
            }
            // Workers are alike: one order of them stands for all (symmetry reduction).
            s.owners.sort();
            Some(s)
        }

        fn properties(&self) -> Vec<Property<Self>> {
            let mut properties: Vec<Property<Self>> = vec![
                Property::always("at most one external effect per key", |_, s: &State| {
                    s.channel.effects <= 1
                }),
                Property::always("a stale owner never completes", |_, s: &State| {
                    !s.stale_completed
                }),
                Property::always("an answer is true", |_, s: &State| {
                    s.client.outcome != Outcome::Answered || s.channel.effects >= 1
                }),
                Property::eventually(
                    "every request ends with an answer or UNKNOWN",
                    |_, s: &State| s.client.outcome != Outcome::Waiting,
                ),
                Property::sometimes(
                    "a lease passes and the record is taken over",
                    |_, s: &State| s.seen & seen::TAKEOVER != 0,
                ),
                Property::sometimes("a stale owner is refused", |_, s: &State| {
                    s.seen & seen::STALE_REFUSED != 0
                }),
                Property::sometimes("the client gets the answer", |_, s: &State| {
                    s.client.outcome == Outcome::Answered
                }),
                Property::sometimes("the client gets UNKNOWN", |_, s: &State| {
                    s.client.outcome == Outcome::Unknown
                }),
                Property::sometimes("an UNKNOWN record is settled", |_, s: &State| {
                    s.seen & seen::SETTLED != 0
                }),
            ];
            if self.recovery == Recovery::Hook {
                properties.push(Property::sometimes(
                    "a takeover resumes with the checkpointed id",
                    |_, s: &State| s.seen & seen::RESUMED != 0,
                ));
            }
            properties
        }
    }
}

pub(crate) mod relay {
    //! The outbox's relay and the consumer's inbox.
    //!
    //! **What it abstracts.** `events` outbox rows, each committed with its business change
    //! before the model starts (the enqueue itself is one transaction and not modelled); the
    //! outbox store's atomic operations on them (`claim`: every unpublished row that no live
    //! claim holds, each claim with a higher claim number; `published` and `failed`, each refused
    //! unless the claim number is still the row's); `relays` relay instances running rounds:
    //! claim a batch, publish every event of it, then mark each one (published, or failed when
    //! its acknowledgement did not come, which frees it for another round); a broker that keeps
    //! every copy it was given until a consumer acknowledges it, and hands it out again when a
    //! consumer crashes or its acknowledgement wait passes; `consumers` consumer instances with
    //! one inbox: each delivery runs one transaction that looks the event id up in the inbox,
    //! and if it is not there applies the effect and records the id, then acknowledges.
    //!
    //! * **Time** is the outbox's clock only, as far as a claim goes: a claim holds or has
    //!   passed. A live relay's claim passes up to `lease_passes` times (a relay that paused past
    //!   its lease); a dead relay's claim always passes eventually. A failed publish is claimed
    //!   again at once (its wait is time, which the model does not have).
    //! * **Faults**: a relay crashes at any step (`relay_crashes`: its round is lost, its claims
    //!   stay until they pass); a publish reaches the broker and its acknowledgement is lost
    //!   (`lost_acks`: the relay counts it failed, and the event goes out again); the broker
    //!   duplicates a copy (`broker_dups`: its duplicate window had passed); a consumer crashes at
    //!   any step (`consumer_crashes`: a copy it had not acknowledged comes back); the broker's
    //!   acknowledgement wait passes while a consumer still works (`redeliveries`: the copy goes
    //!   out again, and the slow consumer's acknowledgement no longer counts).
    //!
    //! **What it checks.** Always: an event's effect is never applied twice. Eventually (on every
    //! path to a state where nothing more can happen, that is once the system is quiescent):
    //! every event is marked published and its effect applied exactly once. Sometimes: an event
    //! is published twice, the inbox absorbs a duplicate, a stale claim's mark is refused (when
    //! a live relay's claim may pass), a consumer crashes between its commit and its
    //! acknowledgement.
    //!
    //! **Bounds** ([`RelayInbox::default`]): 2 events, 2 relays, 1 consumer; each fault once: a
    //! relay crash, a consumer crash, a live relay's claim passing, a lost acknowledgement, a
    //! broker duplicate, a redelivery to a slow consumer. Two more tests: 2 consumers (no
    //! redelivery to a slow consumer), and 2 relay crashes and 2 consumer crashes (with a lost
    //! acknowledgement, and no claim passing, duplicate or slow redelivery). No depth bound: the
    //! counters bound every path (no cycles). Relays are alike and so are consumers: the state
    //! keeps each sorted.
    //!
    //! **Mutations**, each caught by a test: acknowledge before the commit (an event never
    //! applied), the effect and the inbox record in two transactions (an effect applied twice),
    //! mark the batch published before publishing it (an event never published).
    //!
    //! **What it does not cover.** Real time (leases, retry waits, the broker's duplicate
    //! window), quarantine (the model retries a failed publish without limit), order and
    //! versions (`Versions::InOrder` parking), the sweep, the PostgreSQL and JetStream
    //! implementations (the model is their contract: a claim's number, a transaction, an
    //! acknowledgement after the commit), and an effect outside the consumer's database (the
    //! inbox makes only its own database's effect exactly once).

    use stateright::{Model, Property};

    /// The model's bounds and knobs. [`RelayInbox::default`] is the protocol as documented, with
    /// the bounds the tests check.
    #[derive(Clone, Debug)]
    pub(crate) struct RelayInbox {
        /// Outbox rows (events).
        pub(crate) events: usize,
        /// Relay instances.
        pub(crate) relays: usize,
        /// Consumer instances (one inbox).
        pub(crate) consumers: usize,
        /// Relay crashes.
        pub(crate) relay_crashes: u8,
        /// Consumer crashes.
        pub(crate) consumer_crashes: u8,
        /// Times a live relay's claim passes.
        pub(crate) lease_passes: u8,
        /// Publishes whose acknowledgement is lost.
        pub(crate) lost_acks: u8,
        /// Copies the broker duplicates.
        pub(crate) broker_dups: u8,
        /// Copies the broker hands out again while their consumer still works.
        pub(crate) redeliveries: u8,
        /// The relay marks an event published after the broker acknowledged it. Mutation:
        /// `false` (it marks the batch, then publishes it).
        pub(crate) mark_after_publish: bool,
        /// The consumer acknowledges after its transaction committed. Mutation: `false`
        /// (acknowledge, then commit).
        pub(crate) ack_after_commit: bool,
        /// The effect and the inbox record commit in one transaction. Mutation: `false` (the
        /// effect commits, then the record, in a second transaction).
        pub(crate) one_transaction: bool,
    }

    impl Default for RelayInbox {
        fn default() -> Self {
            RelayInbox {
                events: 2,
                relays: 2,
                consumers: 1,
                relay_crashes: 1,
                consumer_crashes: 1,
                lease_passes: 1,
                lost_acks: 1,
                broker_dups: 1,
                redeliveries: 1,
                mark_after_publish: true,
                ack_after_commit: true,
                one_transaction: true,
            }
        }
    }

    /// An outbox row.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Row {
        pub(crate) published: bool,
        /// The latest claim's number.
        pub(crate) claim: u8,
        /// Whether that claim still holds.
        pub(crate) held: bool,
    }

    /// An event of a relay's batch.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Item {
        pub(crate) event: u8,
        pub(crate) claim: u8,
        /// Published: `Some(acknowledged)`.
        pub(crate) sent: Option<bool>,
        pub(crate) marked: bool,
    }

    /// Where a consumer's delivery is.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Step {
        /// Delivered.
        Got,
        /// The effect committed, the record not yet (two transactions only).
        Applied,
        /// Committed (effect and record, or found the record).
        Committed,
        /// Acknowledged before the commit (mutation only).
        Acked,
    }

    /// A consumer instance.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Consumer {
        Idle,
        Busy {
            event: u8,
            /// The broker still counts this delivery (not acknowledged, not handed out again).
            owned: bool,
            step: Step,
        },
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Budget {
        relay_crashes: u8,
        consumer_crashes: u8,
        lease_passes: u8,
        lost_acks: u8,
        broker_dups: u8,
        redeliveries: u8,
    }

    /// Things seen on the way, for the `sometimes` properties.
    pub(crate) mod seen {
        pub(crate) const PUBLISHED_TWICE: u8 = 1;
        pub(crate) const DUPLICATE_ABSORBED: u8 = 2;
        pub(crate) const STALE_MARK: u8 = 4;
        pub(crate) const CRASH_AFTER_COMMIT: u8 = 8;
    }

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    pub(crate) struct State {
        pub(crate) rows: Vec<Row>,
        /// Each relay's round: its batch, empty when idle.
        pub(crate) relays: Vec<Vec<Item>>,
        /// The broker's copies waiting for a consumer, per event.
        pub(crate) ready: Vec<u8>,
        pub(crate) consumers: Vec<Consumer>,
        /// The inbox: event ids recorded (bit per event).
        pub(crate) inbox: u8,
        /// Effects applied, per event.
        pub(crate) effects: Vec<u8>,
        /// Ghost: publishes per event, up to 2.
        pub(crate) publishes: Vec<u8>,
        pub(crate) budget: Budget,
        pub(crate) seen: u8,
    }

    impl State {
        /// Whether a live relay's round holds `event`'s current claim.
        fn claim_alive(&self, event: u8) -> bool {
            let claim = self.rows[event as usize].claim;
            self.relays
                .iter()
                .flatten()
                .any(|item| item.event == event && item.claim == claim && !item.marked)
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Action {
        /// Relay `r` claims every free unpublished row.
        Claim(usize),
        /// Relay `r` publishes its next event; `acked`: the broker's acknowledgement arrives.
        Publish(usize, bool),
        /// Relay `r` marks its next event (published, or failed).
        Mark(usize),
        /// Relay `r` crashes: its round is lost.
        CrashRelay(usize),
        /// A claim on the event passes.
        LeasePasses(u8),
        /// The broker duplicates a copy of the event.
        Duplicate(u8),
        /// The broker hands a copy of the event to an idle consumer.
        Deliver(u8),
        /// The broker's acknowledgement wait for consumer `c`'s delivery passes: the copy goes
        /// out again.
        Redeliver(usize),
        /// Consumer `c` runs its transaction.
        Commit(usize),
        /// Consumer `c` records the event id (second transaction; mutation only).
        Record(usize),
        /// Consumer `c` acknowledges.
        Ack(usize),
        /// Consumer `c` crashes.
        CrashConsumer(usize),
    }

    impl Model for RelayInbox {
        type State = State;
        type Action = Action;

        fn init_states(&self) -> Vec<State> {
            assert!(self.events <= 8, "the inbox is a u8 bit set");
            vec![State {
                rows: vec![
                    Row {
                        published: false,
                        claim: 0,
                        held: false,
                    };
                    self.events
                ],
                relays: vec![Vec::new(); self.relays],
                ready: vec![0; self.events],
                consumers: vec![Consumer::Idle; self.consumers],
                inbox: 0,
                effects: vec![0; self.events],
                publishes: vec![0; self.events],
                budget: Budget {
                    relay_crashes: self.relay_crashes,
                    consumer_crashes: self.consumer_crashes,
                    lease_passes: self.lease_passes,
                    lost_acks: self.lost_acks,
                    broker_dups: self.broker_dups,
                    redeliveries: self.redeliveries,
                },
                seen: 0,
            }]
        }

        fn actions(&self, s: &State, actions: &mut Vec<Action>) {
            let b = &s.budget;
            let claimable = s.rows.iter().any(|row| !row.published && !row.held);
            let mut idle_relay = false;
            for (r, batch) in s.relays.iter().enumerate() {
                if batch.is_empty() {
                    // Idle relays are alike: the first one claims.
                    if claimable && !idle_relay {
                        actions.push(Action::Claim(r));
                    }
                    idle_relay = true;
                    continue;
                }
                let all_sent = batch.iter().all(|item| item.sent.is_some());
                let all_marked = batch.iter().all(|item| item.marked);
                let (publish, mark) = if self.mark_after_publish {
                    (!all_sent, all_sent)
                } else {
                    (all_marked, !all_marked)
                };
                if publish {
                    actions.push(Action::Publish(r, true));
                    if b.lost_acks > 0 {
                        actions.push(Action::Publish(r, false));
                    }
                }
                if mark {
                    actions.push(Action::Mark(r));
                }
                if b.relay_crashes > 0 {
                    actions.push(Action::CrashRelay(r));
                }
            }
            for (e, row) in s.rows.iter().enumerate() {
                let e = e as u8;
                if row.held && (b.lease_passes > 0 || !s.claim_alive(e)) {
                    actions.push(Action::LeasePasses(e));
                }
            }
            let idle_consumer = s.consumers.contains(&Consumer::Idle);
            for (e, &copies) in s.ready.iter().enumerate() {
                if copies > 0 {
                    if idle_consumer {
                        actions.push(Action::Deliver(e as u8));
                    }
                    if b.broker_dups > 0 {
                        actions.push(Action::Duplicate(e as u8));
                    }
                }
            }
            for (c, consumer) in s.consumers.iter().enumerate() {
                let Consumer::Busy { owned, step, .. } = *consumer else {
                    continue;
                };
                match (step, self.ack_after_commit) {
                    (Step::Got, true) | (Step::Acked, false) => actions.push(Action::Commit(c)),
                    (Step::Got, false) | (Step::Committed, _) => actions.push(Action::Ack(c)),
                    (Step::Applied, _) => actions.push(Action::Record(c)),
                    (Step::Acked, true) => unreachable!("acknowledged before the commit"),
                }
                if owned && b.redeliveries > 0 {
                    actions.push(Action::Redeliver(c));
                }
                if b.consumer_crashes > 0 {
                    actions.push(Action::CrashConsumer(c));
                }
            }
        }

        fn next_state(&self, last: &State, action: Action) -> Option<State> {
            let mut s = last.clone();
            match action {
                Action::Claim(r) => {
                    let mut batch = Vec::new();
                    for (e, row) in s.rows.iter_mut().enumerate() {
                        if !row.published && !row.held {
                            row.claim += 1;
                            row.held = true;
                            batch.push(Item {
                                event: e as u8,
                                claim: row.claim,
                                sent: None,
                                marked: false,
                            });
                        }
                    }
                    s.relays[r] = batch;
                }
                Action::Publish(r, acked) => {
                    let item = s.relays[r].iter_mut().find(|item| item.sent.is_none())?;
                    item.sent = Some(acked);
                    let e = item.event as usize;
                    if !acked {
                        s.budget.lost_acks -= 1;
                    }
                    s.ready[e] += 1;
                    s.publishes[e] = (s.publishes[e] + 1).min(2);
                    if s.publishes[e] == 2 {
                        s.seen |= seen::PUBLISHED_TWICE;
                    }
                }
                Action::Mark(r) => {
                    let item = s.relays[r].iter_mut().find(|item| !item.marked)?;
                    item.marked = true;
                    let item = *item;
                    let row = &mut s.rows[item.event as usize];
                    if row.claim == item.claim && !row.published {
                        // `published`, or `failed` (then it is claimed again).
                        if item.sent != Some(false) {
                            row.published = true;
                        }
                        row.held = false;
                    } else {
                        s.seen |= seen::STALE_MARK;
                    }
                }
                Action::CrashRelay(r) => {
                    s.relays[r].clear();
                    s.budget.relay_crashes -= 1;
                }
                Action::LeasePasses(e) => {
                    if s.claim_alive(e) {
                        s.budget.lease_passes -= 1;
                    }
                    s.rows[e as usize].held = false;
                }
                Action::Duplicate(e) => {
                    s.ready[e as usize] += 1;
                    s.budget.broker_dups -= 1;
                }
                Action::Deliver(e) => {
                    let c = s.consumers.iter().position(|c| *c == Consumer::Idle)?;
                    s.ready[e as usize] -= 1;
                    s.consumers[c] = Consumer::Busy {
                        event: e,
                        owned: true,
                        step: Step::Got,
                    };
                }
                Action::Redeliver(c) => {
                    let Consumer::Busy { event, step, .. } = s.consumers[c] else {
                        return None;
                    };
                    s.ready[event as usize] += 1;
                    s.budget.redeliveries -= 1;
                    s.consumers[c] = Consumer::Busy {
                        event,
                        owned: false,
                        step,
                    };
                }
                Action::Commit(c) => {
                    let Consumer::Busy { event, owned, step } = s.consumers[c] else {
                        return None;
                    };
                    let e = event as usize;
                    let recorded = s.inbox & (1 << e) != 0;
                    if recorded {
                        s.seen |= seen::DUPLICATE_ABSORBED;
                    } else {
                        s.effects[e] += 1;
                        if self.one_transaction {
                            s.inbox |= 1 << e;
                        }
                    }
                    s.consumers[c] = match step {
                        // Acknowledged already: done.
                        Step::Acked => Consumer::Idle,
                        _ if recorded || self.one_transaction => Consumer::Busy {
                            event,
                            owned,
                            step: Step::Committed,
                        },
                        _ => Consumer::Busy {
                            event,
                            owned,
                            step: Step::Applied,
                        },
                    };
                }
                Action::Record(c) => {
                    let Consumer::Busy { event, owned, .. } = s.consumers[c] else {
                        return None;
                    };
                    s.inbox |= 1 << event;
                    s.consumers[c] = Consumer::Busy {
                        event,
                        owned,
                        step: Step::Committed,
                    };
                }
                Action::Ack(c) => {
                    let Consumer::Busy { event, step, .. } = s.consumers[c] else {
                        return None;
                    };
                    // The copy is gone from the broker (it left the ready queue on delivery).
                    s.consumers[c] = match step {
                        Step::Got => Consumer::Busy {
                            event,
                            owned: false,
                            step: Step::Acked,
                        },
                        _ => Consumer::Idle,
                    };
                }
                Action::CrashConsumer(c) => {
                    let Consumer::Busy { event, owned, step } = s.consumers[c] else {
                        return None;
                    };
                    if owned {
                        // Not acknowledged: the broker hands it out again.
                        s.ready[event as usize] += 1;
                    }
                    if step == Step::Committed {
                        s.seen |= seen::CRASH_AFTER_COMMIT;
                    }
                    s.consumers[c] = Consumer::Idle;
                    s.budget.consumer_crashes -= 1;
                }
            }
            // A round whose every event is published and marked is over.
            if let Action::Publish(r, _) | Action::Mark(r) = action {
                if s.relays[r]
                    .iter()
                    .all(|item| item.sent.is_some() && item.marked)
                {
                    s.relays[r].clear();
                }
            }
            // Relays are alike, and so are consumers: one order of them stands for all
            // (symmetry reduction).
            s.relays.sort();
            s.consumers.sort();
            Some(s)
        }

        fn properties(&self) -> Vec<Property<Self>> {
            let mut properties = vec![
                Property::always("never two effects for one event", |_, s: &State| {
                    s.effects.iter().all(|&n| n <= 1)
                }),
                Property::eventually(
                    "once quiescent, every event published and applied exactly once",
                    |_, s: &State| {
                        s.effects.iter().all(|&n| n == 1) && s.rows.iter().all(|row| row.published)
                    },
                ),
                Property::sometimes("an event is published twice", |_, s: &State| {
                    s.seen & seen::PUBLISHED_TWICE != 0
                }),
                Property::sometimes("the inbox absorbs a duplicate", |_, s: &State| {
                    s.seen & seen::DUPLICATE_ABSORBED != 0
                }),
                Property::sometimes(
                    "a consumer crashes between its commit and its acknowledgement",
                    |_, s: &State| s.seen & seen::CRASH_AFTER_COMMIT != 0,
                ),
            ];
            // Only a live relay whose claim passed marks with a stale claim.
            if self.lease_passes > 0 {
                properties.push(Property::sometimes(
                    "a stale claim's mark is refused",
                    |_, s: &State| s.seen & seen::STALE_MARK != 0,
                ));
            }
            properties
        }
    }
}

pub(crate) mod queue {
    //! The leased work queue that the UNKNOWN ledger, the reconciliation differences and the
    //! outbox share (`src/queue`): claims with a lease and a fence, holders' fenced writes, the
    //! waits, the manual state, a person's writes, and the sweep.
    //!
    //! **What it abstracts.** `items` rows of one store, each with its state (waiting, claimed,
    //! manual, settled, or swept away), its fence, whether a claim's lease on it still holds,
    //! and whether a waiting row's time has come; `holders` workers (a reconciler, a repairer,
    //! a relay), each claiming every due row when it is idle and then writing each one it holds
    //! (settle it, put it back to wait, or park it in the manual state); a person who settles
    //! any unsettled row by hand and reopens a manual one. Each store operation is one atomic
    //! step, as the queue's contract says: a claim takes the waiting rows whose time has come
    //! and the claimed rows whose lease has passed, and raises each one's fence; a holder's
    //! write applies only while the row is in the claimed state with the holder's fence; a
    //! reopening raises the fence; the sweep deletes settled rows. With `one_state`, the
    //! claimed state is the waiting one (the outbox's pending events: a claim only sets the
    //! lease).
    //!
    //! * **Time** is the queue's clock only: a lease holds or has passed, a wait has passed or
    //!   not. A live holder's lease passes up to `lease_passes` times (a worker that paused
    //!   past its lease and resumes with its old fence); a dead holder's always passes
    //!   eventually; a wait always passes eventually.
    //! * **Faults**: a holder crashes with what it holds (`crashes`); a holder's write is
    //!   delivered a second time later (`resends`: its reply was lost and it sent it again, or
    //!   the network kept a copy), fenced like the first.
    //! * **Budgets**: puts back to wait (`retries`), a person's reopenings (`reopens`) and
    //!   settlements by hand (`by_hand`), so that every path ends.
    //!
    //! A ghost counts each row's claims and reopenings (its epoch): a write that applies is
    //! *late* if a claim or a reopening came after the one it was made under.
    //!
    //! **What it checks.** Always: no late write applies; a row is settled at most once; a
    //! claim never takes a row whose lease still holds (one holder at a time); the manual state
    //! is never claimed; the sweep deletes only settled rows. Eventually (once nothing more can
    //! happen): every row is settled (or swept) or in the manual state, nothing left waiting or
    //! held. Sometimes: a late write is refused, a row is taken over after its lease passed, a
    //! reopened row is claimed again, the sweep deletes a settled row.
    //!
    //! **Bounds** ([`Queue::default`]): 2 rows, 2 holders; a crash, a live holder's lease
    //! passing, a resent write, a put back, a reopening and a settlement by hand, once each.
    //! Run with the claimed state apart (the ledger's and the differences' shape) and with it
    //! the waiting one (the outbox's).
    //!
    //! **Mutations**, each caught by a test: a write not fenced (a late write applies: the row
    //! is not settled twice, its settled state refuses a second write, but a holder that is no
    //! longer its holder decides it); a claim that takes rows whose lease holds (two holders); a claim
    //! that takes the manual state; a sweep that deletes manual rows; and, in the outbox's
    //! shape, a reopening that keeps the fence (a resent write from before it applies: with a
    //! claimed state apart, the state alone keeps it out, which is why the mutation is checked
    //! in the one-state shape).

    use stateright::{Model, Property};

    /// The model's bounds and knobs. [`Queue::default`] is the protocol as the queue
    /// implements it, with the bounds the tests check.
    #[derive(Clone, Debug)]
    pub(crate) struct Queue {
        pub(crate) items: usize,
        pub(crate) holders: usize,
        /// The claimed state is the waiting one (the outbox's shape).
        pub(crate) one_state: bool,
        pub(crate) crashes: u8,
        pub(crate) lease_passes: u8,
        pub(crate) resends: u8,
        pub(crate) retries: u8,
        pub(crate) reopens: u8,
        pub(crate) by_hand: u8,
        /// A holder's write needs the holder's fence. Mutation: `false` (the state alone).
        pub(crate) fence_check: bool,
        /// A claim leaves alone the rows whose lease holds. Mutation: `false`.
        pub(crate) claim_respects_leases: bool,
        /// A claim leaves alone the manual state. Mutation: `false`.
        pub(crate) claim_skips_manual: bool,
        /// The sweep deletes settled rows only. Mutation: `false` (manual ones too).
        pub(crate) sweep_settled_only: bool,
        /// A reopening raises the fence. Mutation: `false`.
        pub(crate) reopen_raises_fence: bool,
    }

    impl Default for Queue {
        fn default() -> Self {
            Queue {
                items: 2,
                holders: 2,
                one_state: false,
                crashes: 1,
                lease_passes: 1,
                resends: 1,
                retries: 1,
                reopens: 1,
                by_hand: 1,
                fence_check: true,
                claim_respects_leases: true,
                claim_skips_manual: true,
                sweep_settled_only: true,
                reopen_raises_fence: true,
            }
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum St {
        Waiting,
        Claimed,
        Manual,
        Settled,
        Swept,
    }

    /// A row of the store.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Row {
        pub(crate) state: St,
        pub(crate) fence: u8,
        /// Claimed: the lease holds.
        pub(crate) held: bool,
        /// Waiting: its time has not come yet.
        pub(crate) later: bool,
        /// Ghost: claims and reopenings so far.
        pub(crate) epoch: u8,
        /// Ghost: settlements applied.
        pub(crate) settled: u8,
    }

    /// What a holder writes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Write {
        Settle,
        RetryLater,
        Park,
    }

    /// A row a holder claimed: the fence it was given, and the epoch it was claimed in.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Held {
        pub(crate) item: u8,
        pub(crate) fence: u8,
        pub(crate) epoch: u8,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) struct Budget {
        crashes: u8,
        lease_passes: u8,
        resends: u8,
        retries: u8,
        reopens: u8,
        by_hand: u8,
    }

    /// Things seen on the way.
    pub(crate) mod seen {
        pub(crate) const LATE_REFUSED: u8 = 1;
        pub(crate) const TAKEN_OVER: u8 = 2;
        pub(crate) const REOPENED_CLAIMED: u8 = 4;
        pub(crate) const SWEPT: u8 = 8;
    }

    /// Broken promises, for the `always` properties.
    pub(crate) mod broken {
        pub(crate) const LATE_WRITE: u8 = 1;
        pub(crate) const LIVE_LEASE_CLAIMED: u8 = 2;
        pub(crate) const MANUAL_CLAIMED: u8 = 4;
        pub(crate) const UNSETTLED_SWEPT: u8 = 8;
    }

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    pub(crate) struct State {
        pub(crate) rows: Vec<Row>,
        /// What each holder holds, not yet written.
        pub(crate) holders: Vec<Vec<Held>>,
        /// Writes sent a second time, not yet delivered.
        pub(crate) resent: Vec<(Held, Write)>,
        /// Rows reopened and not claimed since (bit per row).
        pub(crate) reopened: u8,
        pub(crate) budget: Budget,
        pub(crate) seen: u8,
        pub(crate) broken: u8,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Action {
        /// Holder `h` claims every due row.
        Claim(usize),
        /// Holder `h` writes its `n`th row; `resend`: a second copy is sent later.
        Write(usize, usize, Write, bool),
        /// The `k`th resent write arrives.
        Resent(usize),
        /// Holder `h` crashes.
        Crash(usize),
        /// The lease on row `i` passes.
        LeasePasses(u8),
        /// Row `i`'s wait passes.
        WaitPasses(u8),
        /// A person reopens row `i` (manual).
        Reopen(u8),
        /// A person settles row `i` by hand.
        SettleByHand(u8),
        /// The sweep.
        Sweep,
    }

    impl Queue {
        /// The state a claimed row is in.
        fn claimed(&self) -> St {
            if self.one_state {
                St::Waiting
            } else {
                St::Claimed
            }
        }

        /// Whether a claim takes `row`, and whether that breaks a promise.
        fn due(&self, row: &Row) -> bool {
            let claimed = row.state == self.claimed() && row.held;
            let waiting = row.state == St::Waiting && !row.held && !row.later;
            waiting
                || (row.state == St::Claimed && !row.held)
                || (claimed && !self.claim_respects_leases)
                || (row.state == St::Manual && !self.claim_skips_manual)
        }

        /// Applies `write`, made under `held`, to its row if the store takes it.
        fn apply(&self, s: &mut State, held: Held, write: Write) {
            let row = &mut s.rows[held.item as usize];
            // The lease is not checked: a holder whose lease passed writes until another claim
            // (or a person) moves the fence on.
            let fenced = !self.fence_check || row.fence == held.fence;
            if row.state != self.claimed() || !fenced {
                s.seen |= seen::LATE_REFUSED;
                return;
            }
            if row.epoch != held.epoch {
                s.broken |= broken::LATE_WRITE;
            }
            row.held = false;
            match write {
                Write::Settle => {
                    row.state = St::Settled;
                    row.settled += 1;
                }
                Write::RetryLater => {
                    row.state = St::Waiting;
                    row.later = true;
                }
                Write::Park => row.state = St::Manual,
            }
        }
    }

    impl Model for Queue {
        type State = State;
        type Action = Action;

        fn init_states(&self) -> Vec<State> {
            assert!(self.items <= 8, "rows are a u8 bit set");
            vec![State {
                rows: vec![
                    Row {
                        state: St::Waiting,
                        fence: 0,
                        held: false,
                        later: false,
                        epoch: 0,
                        settled: 0,
                    };
                    self.items
                ],
                holders: vec![Vec::new(); self.holders],
                resent: Vec::new(),
                reopened: 0,
                budget: Budget {
                    crashes: self.crashes,
                    lease_passes: self.lease_passes,
                    resends: self.resends,
                    retries: self.retries,
                    reopens: self.reopens,
                    by_hand: self.by_hand,
                },
                seen: 0,
                broken: 0,
            }]
        }

        fn actions(&self, s: &State, actions: &mut Vec<Action>) {
            let b = &s.budget;
            let claimable = s.rows.iter().any(|row| self.due(row));
            let mut idle = false;
            for (h, held) in s.holders.iter().enumerate() {
                if held.is_empty() {
                    // Idle holders are alike: the first one claims.
                    if claimable && !idle {
                        actions.push(Action::Claim(h));
                    }
                    idle = true;
                    continue;
                }
                for n in 0..held.len() {
                    for write in [Write::Settle, Write::RetryLater, Write::Park] {
                        if write == Write::RetryLater && b.retries == 0 {
                            continue;
                        }
                        actions.push(Action::Write(h, n, write, false));
                        if b.resends > 0 {
                            actions.push(Action::Write(h, n, write, true));
                        }
                    }
                }
                if b.crashes > 0 {
                    actions.push(Action::Crash(h));
                }
            }
            for k in 0..s.resent.len() {
                actions.push(Action::Resent(k));
            }
            for (i, row) in s.rows.iter().enumerate() {
                let i = i as u8;
                let holds = row.held && row.state == self.claimed();
                if holds {
                    let alive = s
                        .holders
                        .iter()
                        .flatten()
                        .any(|h| h.item == i && h.fence == row.fence);
                    if !alive || b.lease_passes > 0 {
                        actions.push(Action::LeasePasses(i));
                    }
                }
                if row.state == St::Waiting && row.later {
                    actions.push(Action::WaitPasses(i));
                }
                if row.state == St::Manual && b.reopens > 0 {
                    actions.push(Action::Reopen(i));
                }
                if !matches!(row.state, St::Settled | St::Swept) && b.by_hand > 0 {
                    actions.push(Action::SettleByHand(i));
                }
            }
            let sweeps = |row: &Row| {
                row.state == St::Settled || (!self.sweep_settled_only && row.state == St::Manual)
            };
            if s.rows.iter().any(sweeps) {
                actions.push(Action::Sweep);
            }
        }

        fn next_state(&self, last: &State, action: Action) -> Option<State> {
            let mut s = last.clone();
            match action {
                Action::Claim(h) => {
                    let mut batch = Vec::new();
                    for (i, row) in s.rows.iter_mut().enumerate() {
                        if !self.due(row) {
                            continue;
                        }
                        if row.state == self.claimed() && row.held {
                            s.broken |= broken::LIVE_LEASE_CLAIMED;
                        }
                        if row.state == St::Manual {
                            s.broken |= broken::MANUAL_CLAIMED;
                        }
                        if row.state == St::Claimed
                            || (row.state == self.claimed() && row.fence > 0)
                        {
                            s.seen |= seen::TAKEN_OVER;
                        }
                        if s.reopened & (1 << i) != 0 {
                            s.seen |= seen::REOPENED_CLAIMED;
                            s.reopened &= !(1 << i);
                        }
                        row.state = self.claimed();
                        row.held = true;
                        row.later = false;
                        row.fence += 1;
                        row.epoch += 1;
                        batch.push(Held {
                            item: i as u8,
                            fence: row.fence,
                            epoch: row.epoch,
                        });
                    }
                    s.holders[h] = batch;
                }
                Action::Write(h, n, write, resend) => {
                    let held = s.holders[h].remove(n);
                    if write == Write::RetryLater {
                        s.budget.retries -= 1;
                    }
                    if resend {
                        s.budget.resends -= 1;
                        s.resent.push((held, write));
                    }
                    self.apply(&mut s, held, write);
                }
                Action::Resent(k) => {
                    let (held, write) = s.resent.remove(k);
                    self.apply(&mut s, held, write);
                }
                Action::Crash(h) => {
                    s.holders[h].clear();
                    s.budget.crashes -= 1;
                }
                Action::LeasePasses(i) => {
                    let fence = s.rows[i as usize].fence;
                    if s.holders
                        .iter()
                        .flatten()
                        .any(|h| h.item == i && h.fence == fence)
                    {
                        s.budget.lease_passes -= 1;
                    }
                    s.rows[i as usize].held = false;
                }
                Action::WaitPasses(i) => s.rows[i as usize].later = false,
                Action::Reopen(i) => {
                    let row = &mut s.rows[i as usize];
                    row.state = St::Waiting;
                    row.later = false;
                    row.held = false;
                    row.epoch += 1;
                    if self.reopen_raises_fence {
                        row.fence += 1;
                    }
                    s.reopened |= 1 << i;
                    s.budget.reopens -= 1;
                }
                Action::SettleByHand(i) => {
                    let row = &mut s.rows[i as usize];
                    row.state = St::Settled;
                    row.held = false;
                    row.later = false;
                    row.epoch += 1;
                    row.settled += 1;
                    s.budget.by_hand -= 1;
                }
                Action::Sweep => {
                    for row in &mut s.rows {
                        match row.state {
                            St::Settled => {
                                row.state = St::Swept;
                                s.seen |= seen::SWEPT;
                            }
                            St::Manual if !self.sweep_settled_only => {
                                row.state = St::Swept;
                                s.broken |= broken::UNSETTLED_SWEPT;
                            }
                            _ => {}
                        }
                    }
                }
            }
            // Holders are alike: one order of them stands for all (symmetry reduction).
            for held in &mut s.holders {
                held.sort();
            }
            s.holders.sort();
            s.resent.sort();
            Some(s)
        }

        fn properties(&self) -> Vec<Property<Self>> {
            let mut properties = vec![
                Property::always("no late write applies", |_, s: &State| {
                    s.broken & broken::LATE_WRITE == 0
                }),
                Property::always("a row is settled at most once", |_, s: &State| {
                    s.rows.iter().all(|row| row.settled <= 1)
                }),
                Property::always("a live lease has one holder", |_, s: &State| {
                    s.broken & broken::LIVE_LEASE_CLAIMED == 0
                }),
                Property::always("the manual state is never claimed", |_, s: &State| {
                    s.broken & broken::MANUAL_CLAIMED == 0
                }),
                Property::always("the sweep deletes only settled rows", |_, s: &State| {
                    s.broken & broken::UNSETTLED_SWEPT == 0
                }),
                Property::eventually(
                    "once quiet, every row is settled or in the manual state",
                    |_, s: &State| {
                        s.rows
                            .iter()
                            .all(|row| matches!(row.state, St::Settled | St::Swept | St::Manual))
                    },
                ),
                Property::sometimes("a late write is refused", |_, s: &State| {
                    s.seen & seen::LATE_REFUSED != 0
                }),
                Property::sometimes("a row is taken over", |_, s: &State| {
                    s.seen & seen::TAKEN_OVER != 0
                }),
                Property::sometimes("the sweep deletes a settled row", |_, s: &State| {
                    s.seen & seen::SWEPT != 0
                }),
            ];
            if self.reopens > 0 {
                properties.push(Property::sometimes(
                    "a reopened row is claimed again",
                    |_, s: &State| s.seen & seen::REOPENED_CLAIMED != 0,
                ));
            }
            properties
        }
    }
}

/// Checks `model` exhaustively, asserts that every `always` and `eventually` property holds and
/// every `sometimes` one is reached, and that the search visited `states` distinct states: the
/// number changes when the model or its bounds do (update it then, and the docs that quote it).
fn holds<M>(label: &str, model: M, states: usize)
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + Debug + 'static,
    M::Action: Clone + PartialEq + Debug,
{
    let checker = check(label, model, None);
    checker.assert_properties();
    assert_eq!(
        checker.unique_state_count(),
        states,
        "{label}: distinct states"
    );
}

/// Checks `model` until it finds a counterexample to `property`, and prints it; fails if the
/// whole state space holds none.
fn caught<M>(label: &str, model: M, property: &'static str)
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + Debug + 'static,
    M::Action: Clone + PartialEq + Debug,
{
    let checker = check(label, model, Some(property));
    assert!(
        checker.discovery(property).is_some(),
        "{label}: \"{property}\" holds"
    );
    counterexample(&checker, property);
}

const ONE_EFFECT: &str = "at most one external effect per key";
const STALE_OWNER: &str = "a stale owner never completes";
const NEVER_TWICE: &str = "never two effects for one event";
const QUIESCENT: &str = "once quiescent, every event published and applied exactly once";

// The key protocol as documented: with the recovery hook, two and three owners; with the rule.

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn key_protocol_holds_with_the_recovery_hook() {
    holds(
        "key protocol, hook, 2 owners",
        key::KeyProtocol::default(),
        1_912_364,
    );
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn key_protocol_holds_with_three_owners() {
    let model = key::KeyProtocol {
        owners: 3,
        ..key::KeyProtocol::default()
    };
    holds("key protocol, hook, 3 owners", model, 2_366_395);
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn key_protocol_holds_without_a_hook() {
    let model = key::KeyProtocol {
        recovery: key::Recovery::Rule,
        ..key::KeyProtocol::default()
    };
    holds("key protocol, rule, 2 owners", model, 1_081_566);
}

// Its mutations, each caught.

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn key_mutant_without_the_fence_check() {
    let model = key::KeyProtocol {
        fence_check: false,
        ..key::KeyProtocol::default()
    };
    caught("mutant: no fence check", model.clone(), STALE_OWNER);
    caught("mutant: no fence check", model, ONE_EFFECT);
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn key_mutant_calling_the_channel_before_the_checkpoint() {
    let model = key::KeyProtocol {
        checkpoint_first: false,
        ..key::KeyProtocol::default()
    };
    caught("mutant: call, then checkpoint", model, ONE_EFFECT);
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn key_mutant_rerunning_blindly_on_a_takeover() {
    let model = key::KeyProtocol {
        recovery: key::Recovery::Blind,
        ..key::KeyProtocol::default()
    };
    caught("mutant: blind rerun", model, ONE_EFFECT);
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn key_mutant_releasing_a_dropped_handler_after_its_checkpoint() {
    let model = key::KeyProtocol {
        guard_checks_checkpoints: false,
        ..key::KeyProtocol::default()
    };
    caught("mutant: the guard always releases", model, ONE_EFFECT);
}

// What the protocol needs from outside the crate: a settler whose "it did not happen" is final,
// and a channel that honours its request id. Without either, an owner paused past its lease
// charges a second time.

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn key_settling_by_asking_alone_charges_twice() {
    for recovery in [key::Recovery::Hook, key::Recovery::Rule] {
        let model = key::KeyProtocol {
            settle_voids: false,
            recovery,
            ..key::KeyProtocol::default()
        };
        caught("settler asks, never voids", model, ONE_EFFECT);
    }
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn key_a_channel_without_request_ids_charges_twice() {
    let model = key::KeyProtocol {
        channel_dedups: false,
        ..key::KeyProtocol::default()
    };
    caught("channel without dedup", model, ONE_EFFECT);
}

// The relay and the inbox as documented: one consumer, then two, then more crashes.

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn relay_and_inbox_hold() {
    holds(
        "relay and inbox, 1 consumer",
        relay::RelayInbox::default(),
        2_985_974,
    );
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn relay_and_inbox_hold_with_two_consumers() {
    let model = relay::RelayInbox {
        consumers: 2,
        redeliveries: 0,
        ..relay::RelayInbox::default()
    };
    holds("relay and inbox, 2 consumers", model, 1_858_547);
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn relay_and_inbox_hold_with_two_crashes_each() {
    let model = relay::RelayInbox {
        relay_crashes: 2,
        consumer_crashes: 2,
        lease_passes: 0,
        broker_dups: 0,
        redeliveries: 0,
        ..relay::RelayInbox::default()
    };
    holds("relay and inbox, 2 crashes each", model, 276_955);
}

// Their mutations, each caught.

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn relay_mutant_acknowledging_before_the_commit() {
    let model = relay::RelayInbox {
        ack_after_commit: false,
        ..relay::RelayInbox::default()
    };
    caught("mutant: ack, then commit", model, QUIESCENT);
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn relay_mutant_recording_in_a_second_transaction() {
    let model = relay::RelayInbox {
        one_transaction: false,
        ..relay::RelayInbox::default()
    };
    caught("mutant: effect, then record", model, NEVER_TWICE);
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn relay_mutant_marking_before_publishing() {
    let model = relay::RelayInbox {
        mark_after_publish: false,
        ..relay::RelayInbox::default()
    };
    caught("mutant: mark, then publish", model, QUIESCENT);
}

// The leased work queue as implemented: its claimed state apart (the ledger's, the
// differences'), and the waiting state claimed (the outbox's).

const LATE_WRITE: &str = "no late write applies";

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn queue_protocol_holds() {
    holds(
        "queue, claimed state apart",
        queue::Queue::default(),
        190_507,
    );
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn queue_protocol_holds_in_the_outboxs_shape() {
    let model = queue::Queue {
        one_state: true,
        ..queue::Queue::default()
    };
    holds("queue, one state", model, 197_457);
}

// Its mutations, each caught.

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn queue_mutant_without_the_fence_check() {
    for one_state in [false, true] {
        let model = queue::Queue {
            fence_check: false,
            one_state,
            ..queue::Queue::default()
        };
        caught("mutant: no fence check", model, LATE_WRITE);
    }
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn queue_mutant_claiming_a_held_lease() {
    let model = queue::Queue {
        claim_respects_leases: false,
        ..queue::Queue::default()
    };
    caught(
        "mutant: claims held leases",
        model,
        "a live lease has one holder",
    );
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn queue_mutant_claiming_the_manual_state() {
    let model = queue::Queue {
        claim_skips_manual: false,
        ..queue::Queue::default()
    };
    caught(
        "mutant: claims the manual state",
        model,
        "the manual state is never claimed",
    );
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn queue_mutant_sweeping_manual_rows() {
    let model = queue::Queue {
        sweep_settled_only: false,
        ..queue::Queue::default()
    };
    caught(
        "mutant: sweeps manual rows",
        model,
        "the sweep deletes only settled rows",
    );
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn queue_mutant_reopening_without_a_new_fence() {
    let model = queue::Queue {
        reopen_raises_fence: false,
        one_state: true,
        ..queue::Queue::default()
    };
    caught("mutant: reopens under the old fence", model, LATE_WRITE);
}

/// A check, run as the test of the same name in `tests/models/protocols.rs`.
pub fn the_models_have_no_cycles() {
    let key = key::KeyProtocol {
        losses: 1,
        pauses: 2,
        crashes: 1,
        ..key::KeyProtocol::default()
    };
    assert_acyclic("key protocol, lighter bounds", &key);
    let relay = relay::RelayInbox {
        consumers: 2,
        lease_passes: 0,
        broker_dups: 0,
        ..relay::RelayInbox::default()
    };
    assert_acyclic("relay and inbox, lighter bounds", &relay);
    assert_acyclic("queue", &queue::Queue::default());
    let outbox_shape = queue::Queue {
        one_state: true,
        ..queue::Queue::default()
    };
    assert_acyclic("queue, one state", &outbox_shape);
}
