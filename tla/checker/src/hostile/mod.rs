//! The hostile relay (C-OR-2, C-AZ-2): alice (the principal's custodian)
//! grants, then revokes, a consent scope for the edge; a second pinned peer
//! of the edge (a relay's own identity) grants the same scope in its own
//! name, with any sequence it likes. Every frame passes through a relay
//! that holds, reorders, loses, duplicates and replays frames, but cannot
//! forge one: the edge sees each frame as coming from the peer that sealed
//! it.
//!
//! The issuers run the real [`Custodian`](abhyasa_core::custody::Custodian)
//! and the edge the real [`Receiver`](abhyasa_core::custody::Receiver) with
//! the [`StandardApplier`](abhyasa_core::custody::StandardApplier). Each
//! obligation is handed to its custodian as the issuer's caller hands it
//! over (alice's revoke with no sequence, as `abhyasa send` does), so the
//! sequences on the wire are exactly the ones the custodian assigns.
//! Nothing crashes here (the main model covers crashes); every side commits
//! after each input, before anything it releases is sent.
//!
//! Properties ([`properties`]): at quiescence the edge holds no authority
//! on a key alice's latest decision withdrew there, and alice's custody
//! never reports that revoke `applied` while the edge holds it (C-OR-2); no
//! two issuers ever write the same governed key (C-AZ-2).

mod checked;
pub mod config;
pub mod model;
pub mod properties;
pub mod trace;

use std::time::Instant;

use stateright::{Checker, Expectation, HasDiscoveries, Model};

pub use config::{HostileConfig, SecondIssuer};
pub use model::{HAction, HState, HostileModel};

use crate::run::{wait, CheckReport, Counterexample, RunOptions, Search};

/// Explores the configuration's whole bounded state space (or stops early
/// as `opts` says) and reports what it found.
pub fn check(config: HostileConfig, opts: RunOptions) -> Result<CheckReport, String> {
    let described = config.to_string();
    let model = HostileModel::new(config)?;
    let start = Instant::now();
    let mut builder = model.checker().threads(opts.threads.max(1));
    if opts.stop_at_first_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    if let Some(n) = opts.max_states {
        builder = builder.target_state_count(n);
    }
    Ok(match opts.search {
        Search::BreadthFirst => summarize(
            wait(builder.spawn_bfs(), &opts, start),
            described,
            start,
            &opts,
        ),
        Search::DepthFirst => summarize(
            wait(builder.spawn_dfs(), &opts, start),
            described,
            start,
            &opts,
        ),
    })
}

fn summarize<C: Checker<HostileModel>>(
    checker: C,
    described: String,
    start: Instant,
    opts: &RunOptions,
) -> CheckReport {
    let elapsed = start.elapsed();
    let discoveries = checker.discoveries();
    let model = checker.model();
    let mut counterexamples = Vec::new();
    let mut examples_found = Vec::new();
    let mut examples_missing = Vec::new();
    for p in &model.properties() {
        match (&p.expectation, discoveries.get(p.name)) {
            (Expectation::Sometimes, Some(_)) => examples_found.push(p.name),
            (Expectation::Sometimes, None) => examples_missing.push(p.name),
            (_, Some(path)) => counterexamples.push(Counterexample {
                property: p.name,
                steps: path.clone().into_actions().len(),
                trace: trace::render(model, path),
            }),
            (_, None) => {}
        }
    }
    counterexamples.sort_by_key(|c| c.steps);
    CheckReport {
        config: described,
        distinct_states: checker.unique_state_count(),
        generated_states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        search: opts.search,
        threads: opts.threads.max(1),
        complete: (!opts.stop_at_first_failure || counterexamples.is_empty())
            && opts.max_states.is_none_or(|n| checker.state_count() < n),
        counterexamples,
        examples_found,
        examples_missing,
    }
}
