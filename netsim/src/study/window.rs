//! The window-length study (`abhyasa-sim study window-length`): escalation
//! and spurious-escalation rates against the length of an edge's contact
//! windows, relayed against direct.
//!
//! The scenario must have a `[relay]` with at least one `[[relay.window]]`.
//! For each window length (every window's `open`), two runs per seed:
//! *relayed* (the scenario as given: the relay holds frames across the
//! gaps and pushes when the edge dials in) and *direct* (no relay: the
//! custodian <-> receiver links partitioned exactly outside the same
//! windows, so the custodian's backoff must hit a window). Writes
//! `window.csv` (one row per run), `window-summary.csv` (pooled rates with
//! Wilson 95 % intervals) and `window.svg`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use super::csv::wilson;
use super::{format_ms, io_err, StudyError};
use crate::fullstack::{run_scenario, Direction, Dur, Partition, Scenario};

/// What to run.
#[derive(Clone, Debug)]
pub struct WindowLengthStudy {
    /// A relayed scenario with contact windows.
    pub scenario: Scenario,
    /// Window lengths swept.
    pub lengths: Vec<Duration>,
    /// Seeds per length and mode.
    pub seeds: u32,
    /// Seed of seed index 0.
    pub base_seed: u64,
}

/// One run.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowRow {
    /// `relayed` or `direct`.
    pub mode: &'static str,
    /// Window length, ms.
    pub open_ms: u64,
    /// Seed.
    pub seed: u64,
    /// Taken into custody.
    pub custody: u64,
    /// Applied.
    pub applied: u64,
    /// Escalated.
    pub escalated: u64,
    /// Escalated although the receiver applied.
    pub spurious: u64,
    /// Broken invariants.
    pub violations: u64,
}

/// CSV header of `window.csv`.
pub const WINDOW_CSV_HEADER: &str =
    "mode,open_ms,seed,custody,applied,escalated,spurious_escalations,violations";

impl WindowLengthStudy {
    /// The scenario of `mode` at window length `open`.
    pub fn variant(&self, open: Duration, relayed: bool) -> Result<Scenario, StudyError> {
        let mut s = self.scenario.clone();
        let bad = |problem: &str| StudyError::Scenario {
            scenario: self.scenario.name.clone(),
            problem: problem.into(),
        };
        let relay = s
            .relay
            .as_mut()
            .ok_or_else(|| bad("has no [relay] whose windows could be swept"))?;
        if relay.windows.is_empty() {
            return Err(bad("has no [[relay.window]] whose length could be swept"));
        }
        for w in &mut relay.windows {
            w.open = Dur(open);
        }
        if !relayed {
            // The same schedule on the direct links: down outside every
            // window of each receiver.
            let end = s.run_length();
            let mut parts = Vec::new();
            for edge in s.resolve_side("receivers") {
                let Some(ws) = s.windows_of(&edge) else {
                    continue;
                };
                let mut down_from = Duration::ZERO;
                for (o, c) in ws.iter().copied().chain([(end, end)]) {
                    if o > down_from {
                        parts.push(Partition {
                            between: ["custodians".into(), edge.clone()],
                            at: Dur(down_from),
                            duration: Dur(o - down_from),
                            direction: Direction::Both,
                            flap: None,
                        });
                    }
                    down_from = down_from.max(c);
                }
            }
            s.relay = None;
            s.partitions.extend(parts);
        }
        s.validate().map_err(|e| {
            bad(&format!(
                "with windows of {}: {e}",
                format_ms(u64::try_from(open.as_millis()).unwrap_or(u64::MAX))
            ))
        })?;
        Ok(s)
    }

    /// Runs every (length, mode, seed), in that order.
    pub fn run(&self) -> Result<Vec<WindowRow>, StudyError> {
        let mut rows = Vec::new();
        for &open in &self.lengths {
            for relayed in [true, false] {
                let s = self.variant(open, relayed)?;
                for j in 0..self.seeds {
                    let seed = self.base_seed.wrapping_add(u64::from(j));
                    let open_ms = u64::try_from(open.as_millis()).unwrap_or(u64::MAX);
                    let r = run_scenario(&s, seed).map_err(|e| StudyError::Run {
                        scenario: s.name.clone(),
                        duration: format_ms(open_ms),
                        seed,
                        message: e.to_string(),
                    })?;
                    rows.push(WindowRow {
                        mode: if relayed { "relayed" } else { "direct" },
                        open_ms,
                        seed,
                        custody: r.custody,
                        applied: r.outcomes.applied,
                        escalated: r.outcomes.escalated,
                        spurious: r.spurious_escalations,
                        violations: r.violation_count,
                    });
                }
            }
        }
        Ok(rows)
    }
}

/// Pooled per (mode, length): (mode, open_ms, custody, escalated, spurious,
/// violations).
fn pooled(rows: &[WindowRow]) -> Vec<(&'static str, u64, u64, u64, u64, u64)> {
    let mut out: Vec<(&'static str, u64, u64, u64, u64, u64)> = Vec::new();
    for r in rows {
        match out.last_mut() {
            Some(p) if p.0 == r.mode && p.1 == r.open_ms => {
                p.2 += r.custody;
                p.3 += r.escalated;
                p.4 += r.spurious;
                p.5 += r.violations;
            }
            _ => out.push((
                r.mode,
                r.open_ms,
                r.custody,
                r.escalated,
                r.spurious,
                r.violations,
            )),
        }
    }
    out
}

/// Writes `window.csv`, `window-summary.csv` and `window.svg` into `dir`;
/// returns the summary as a table for the terminal.
pub fn write_window_study(
    scenario: &str,
    rows: &[WindowRow],
    dir: &Path,
) -> Result<String, StudyError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut csv = format!("{WINDOW_CSV_HEADER}\n");
    for r in rows {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{}",
            r.mode, r.open_ms, r.seed, r.custody, r.applied, r.escalated, r.spurious, r.violations
        );
    }
    let mut summary = String::from(
        "mode,open_ms,custody,escalated,escalation_rate,escalation_lo,escalation_hi,spurious_escalations,spurious_rate,spurious_lo,spurious_hi,violations\n",
    );
    let mut table = format!("study window-length: scenario {scenario}\n  mode      window  custody  escalated  rate     spurious  rate     violations\n");
    let pooled = pooled(rows);
    for (mode, open, custody, esc, spu, viol) in &pooled {
        let (e, elo, ehi) = wilson(*esc, *custody);
        let (p, plo, phi) = wilson(*spu, *custody);
        let _ = writeln!(
            summary,
            "{mode},{open},{custody},{esc},{e:.6},{elo:.6},{ehi:.6},{spu},{p:.6},{plo:.6},{phi:.6},{viol}"
        );
        let _ = writeln!(
            table,
            "  {mode:<8}  {:>6}  {custody:>7}  {esc:>9}  {:>6.2}%  {spu:>8}  {:>6.2}%  {viol:>10}",
            format_ms(*open),
            100.0 * e,
            100.0 * p
        );
    }
    let put = |name: &str, text: &str| -> Result<(), StudyError> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(io_err(&p))
    };
    put("window.csv", &csv)?;
    put("window-summary.csv", &summary)?;
    put("window.svg", &render(scenario, &pooled)?)?;
    Ok(table)
}

fn plot_err(e: impl std::fmt::Display) -> StudyError {
    StudyError::Plot(e.to_string())
}

type Pooled = (&'static str, u64, u64, u64, u64, u64);

fn render(scenario: &str, pooled: &[Pooled]) -> Result<String, StudyError> {
    let x_hi = pooled.iter().map(|p| p.1).max().unwrap_or(1) as f64 / 1000.0 * 1.05 + 0.5;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{scenario}: escalation vs contact-window length, relayed vs direct"),
                ("sans-serif", 24),
            )
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_hi, 0.0..1.0)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("window length (s)")
            .y_desc("rate per custody transfer")
            .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
            .axis_desc_style(("sans-serif", 20))
            .label_style(("sans-serif", 16))
            .draw()
            .map_err(plot_err)?;
        let series = [
            (
                "relayed",
                false,
                RGBColor(200, 40, 40),
                "relayed: escalation",
            ),
            ("relayed", true, RGBColor(30, 90, 200), "relayed: spurious"),
            (
                "direct",
                false,
                RGBColor(230, 150, 30),
                "direct: escalation",
            ),
            ("direct", true, RGBColor(40, 160, 90), "direct: spurious"),
        ];
        for (mode, spurious, colour, label) in series {
            let pts: Vec<(f64, f64)> = pooled
                .iter()
                .filter(|p| p.0 == mode)
                .map(|p| {
                    let n = if spurious { p.4 } else { p.3 };
                    (p.1 as f64 / 1000.0, wilson(n, p.2).0)
                })
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|p| Circle::new(*p, 3, colour.filled())))
                .map_err(plot_err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 17))
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}
