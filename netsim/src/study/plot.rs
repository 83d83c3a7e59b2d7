//! `study.svg`: escalation and spurious-escalation rates against
//! partition length, Wilson 95 % intervals as whiskers, the deadline as a
//! vertical line. SVG backend only: text is emitted as `<text>`, so no
//! font or C library is needed, and the output is a function of the data.

use plotters::prelude::*;

use super::csv::DurationSummary;
use super::{format_ms, StudyError, StudyIdentity};

const ESCALATION: RGBColor = RGBColor(200, 40, 40);
const SPURIOUS: RGBColor = RGBColor(30, 90, 200);
const DEADLINE: RGBColor = RGBColor(90, 90, 90);

fn plot_err(e: impl std::fmt::Display) -> StudyError {
    StudyError::Plot(e.to_string())
}

/// Renders the study's plot as an SVG document.
pub fn render_svg(id: &StudyIdentity, summary: &[DurationSummary]) -> Result<String, StudyError> {
    // Seconds up to an hour, then minutes.
    let far = id.to_ms.max(id.deadline_ms);
    let (div, unit) = if far <= 3_600_000 {
        (1000.0, "s")
    } else {
        (60_000.0, "min")
    };
    let x = |ms: u64| ms as f64 / div;
    let x_hi = (x(far) * 1.05).max(x(id.from_ms) + 1.0);
    let x_lo = (x(id.from_ms.min(id.deadline_ms)) - 0.02 * x_hi).min(0.0);
    let esc: Vec<(f64, (f64, f64, f64))> = summary
        .iter()
        .map(|s| (x(s.duration_ms), s.escalation_rate()))
        .collect();
    let spu: Vec<(f64, (f64, f64, f64))> = summary
        .iter()
        .map(|s| (x(s.duration_ms), s.spurious_rate()))
        .collect();
    let top = esc
        .iter()
        .chain(&spu)
        .map(|(_, (_, _, hi))| *hi)
        .fold(0.0_f64, f64::max);
    // Room above the highest whisker for the legend; at most 100 %.
    let y_hi = ((top * 1.35).max(0.05) * 20.0).ceil() / 20.0;
    let y_hi = y_hi.min(1.0);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let runs = summary.first().map_or(0, |s| s.runs);
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{}: escalation vs partition length ({} seeds per point, base seed {})",
                    id.scenario, runs, id.base_seed
                ),
                ("sans-serif", 24),
            )
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(x_lo..x_hi, 0.0..y_hi)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(format!("partition duration ({unit})"))
            .y_desc("rate per custody transfer")
            .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .axis_desc_style(("sans-serif", 20))
            .label_style(("sans-serif", 16))
            .draw()
            .map_err(plot_err)?;

        for (pts, colour, label) in [
            (&esc, ESCALATION, "escalation rate (escalated / custody)"),
            (
                &spu,
                SPURIOUS,
                "spurious-escalation rate (escalated although applied / custody)",
            ),
        ] {
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|(x, (p, _, _))| (*x, *p)),
                    colour.stroke_width(2),
                ))
                .map_err(plot_err)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
            chart
                .draw_series(
                    pts.iter()
                        .map(|(x, (p, _, _))| Circle::new((*x, *p), 3, colour.filled())),
                )
                .map_err(plot_err)?;
            // 95 % intervals as whiskers.
            chart
                .draw_series(pts.iter().map(|(x, (_, lo, hi))| {
                    PathElement::new(vec![(*x, *lo), (*x, *hi)], colour.mix(0.6).stroke_width(1))
                }))
                .map_err(plot_err)?;
        }

        let dl = x(id.deadline_ms);
        chart
            .draw_series(DashedLineSeries::new(
                [(dl, 0.0), (dl, y_hi)],
                6,
                4,
                DEADLINE.stroke_width(2),
            ))
            .map_err(plot_err)?
            .label(format!("custody deadline ({})", format_ms(id.deadline_ms)))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], DEADLINE.stroke_width(2)));
        chart
            .draw_series(std::iter::once(Text::new(
                format!("deadline {}", format_ms(id.deadline_ms)),
                (dl + 0.01 * x_hi, y_hi * 0.6),
                ("sans-serif", 18).into_font().color(&DEADLINE),
            )))
            .map_err(plot_err)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 17))
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}
