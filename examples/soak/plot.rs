//! The samples as an SVG: rows per table, RSS per process, and the calls' p50 and p99, over
//! time; the backlog's sweep shaded (from its insert to its last row swept), the faults marked.

use std::path::Path;

use crate::sample::Sample;
use crate::BoxError;

/// A fault, for the plot: when (seconds since the start) and its name.
pub(crate) type Mark = (f64, &'static str);

/// `backlog`: from the backlog's insert to its last row swept, if it was.
pub(crate) fn svg(
    path: &Path,
    title: &str,
    samples: &[Sample],
    faults: &[Mark],
    backlog: Option<(f64, f64)>,
) -> Result<(), BoxError> {
    use plotters::prelude::*;

    let Some(first) = samples.first() else {
        return Ok(());
    };
    let end = samples.last().map_or(1.0, |s| s.t).max(1.0);
    let root = SVGBackend::new(path, (1400, 1500)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let panels = root.split_evenly((3, 1));
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        BLACK,
    ];
    type Series = (String, Vec<(f64, f64)>);
    let tables: Vec<Series> = first
        .tables
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let points = samples
                .iter()
                .filter_map(|s| s.tables.get(i).map(|x| (s.t, x.rows as f64)))
                .collect();
            (t.table.clone(), points)
        })
        .collect();
    let rss: Vec<Series> = first
        .procs
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let points = samples
                .iter()
                .filter_map(|s| {
                    let p = s.procs.get(i)?.1?;
                    Some((s.t, p.rss_kb as f64 / 1024.0))
                })
                .collect();
            ((*name).to_owned(), points)
        })
        .collect();
    let latency: Vec<Series> = vec![
        (
            "p50".to_owned(),
            samples
                .iter()
                .filter_map(|s| Some((s.t, s.p50_ms?)))
                .collect(),
        ),
        (
            "p99".to_owned(),
            samples
                .iter()
                .filter_map(|s| Some((s.t, s.p99_ms?)))
                .collect(),
        ),
    ];
    let charts: [(&str, &str, &[Series]); 3] = [
        ("rows per table (exact count)", "rows", &tables),
        ("RSS per process", "MiB", &rss),
        ("calls' latency over each interval", "ms", &latency),
    ];
    for ((caption, unit, series), panel) in charts.into_iter().zip(panels.iter()) {
        let top = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
            .fold(1.0_f64, f64::max)
            * 1.08;
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..end, 0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("s")
            .y_desc(unit)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        if let Some((from, to)) = backlog {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(from, 0.0), (to.max(from + end / 400.0), top)],
                RGBColor(255, 220, 160).filled(),
            )))?;
        }
        for (at, name) in faults {
            chart.draw_series(LineSeries::new(
                vec![(*at, 0.0), (*at, top)],
                RGBColor(120, 120, 120).stroke_width(1),
            ))?;
            chart.draw_series(std::iter::once(Text::new(
                *name,
                (*at, top * 0.97),
                ("sans-serif", 11).into_font().color(&RGBColor(90, 90, 90)),
            )))?;
        }
        for ((name, points), color) in series.iter().zip(colors.iter().cycle()) {
            let color = *color;
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
