//! `--plot FILE.svg`: the curves of `dlock bench --scale`, drawn from its JSON report, one panel
//! per curve, the size on a log axis and dlock next to its raw floor where there is one.
//!
//! The SVG names its fonts and leaves drawing the glyphs to the viewer, so no font (no system
//! library) is needed here.

use std::error::Error;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

/// One line of a panel: its name, colour and points.
struct Line {
    label: &'static str,
    colour: RGBColor,
    points: Vec<(f64, f64)>,
}

/// One panel: its title, axes and lines.
struct Panel {
    title: String,
    x: &'static str,
    y: &'static str,
    lines: Vec<Line>,
}

const DLOCK: RGBColor = RGBColor(31, 119, 180);
const FLOOR: RGBColor = RGBColor(127, 127, 127);
const SERVER: RGBColor = RGBColor(214, 39, 40);
const MEMORY: RGBColor = RGBColor(44, 160, 44);

/// `(entry[x], entry[y])` of every entry of `entries` that has both.
fn points(entries: &Value, x: &str, y: &str) -> Vec<(f64, f64)> {
    entries
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e[x].as_f64()?, e[y].as_f64()?)))
        .collect()
}

/// `points(entries, x, y)` each divided by the first entry's `y`: 1 everywhere is a cost that
/// grows exactly as the work does.
fn relative(entries: &Value, x: &str, y: &str) -> Vec<(f64, f64)> {
    let all = points(entries, x, y);
    match all.first() {
        Some(&(_, base)) if base > 0.0 => all.iter().map(|&(x, y)| (x, y / base)).collect(),
        _ => Vec::new(),
    }
}

fn line(label: &'static str, colour: RGBColor, points: Vec<(f64, f64)>) -> Line {
    Line {
        label,
        colour,
        points,
    }
}

/// The panels `report` has curves for.
fn panels(report: &Value) -> Vec<Panel> {
    let backend = report["backend"].as_str().unwrap_or("");
    let mut panels = Vec::new();
    let held = &report["held"];
    if held.is_array() {
        panels.push(Panel {
            title: format!("held: acquire + release, {backend}"),
            x: "locks held (N)",
            y: "locks/s",
            lines: vec![
                line("dlock", DLOCK, points(held, "locks", "pairs_per_sec")),
                line(
                    "raw floor pairs",
                    FLOOR,
                    points(held, "locks", "floor_pairs_per_sec"),
                ),
            ],
        });
        panels.push(Panel {
            title: "held: cost per held lock, relative to the smallest N".to_owned(),
            x: "locks held (N)",
            y: "x smallest N",
            lines: vec![
                line(
                    "client CPU per lock-s",
                    DLOCK,
                    relative(held, "locks", "cpu_us_per_lock_s"),
                ),
                line(
                    "server requests per lock-s",
                    SERVER,
                    relative(held, "locks", "requests_per_lock_s"),
                ),
                line(
                    "client bytes per guard",
                    MEMORY,
                    relative(held, "locks", "bytes_per_guard"),
                ),
            ],
        });
    }
    let queue = &report["queue"];
    if queue.is_array() {
        panels.push(Panel {
            title: "queue: hand-off p50".to_owned(),
            x: "waiters (W)",
            y: "µs",
            lines: vec![
                line("dlock p50", DLOCK, points(queue, "waiters", "p50_us")),
                line(
                    "raw floor p50 (≤32 conns)",
                    FLOOR,
                    points(queue, "waiters", "floor_p50_us"),
                ),
            ],
        });
    }
    let names = &report["names"];
    if names.is_array() {
        panels.push(Panel {
            title: "names: each used once".to_owned(),
            x: "distinct names (M)",
            y: "names/s",
            lines: vec![
                line("dlock", DLOCK, points(names, "names", "per_sec")),
                line(
                    "raw floor pairs",
                    FLOOR,
                    points(names, "names", "floor_pairs_per_sec"),
                ),
            ],
        });
    }
    panels
}

/// A tick's label: whole numbers without decimals (`5000`, not `5000.0`), others as they are.
fn tick(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{}", (value * 1000.0).round() / 1000.0)
    }
}

/// Draws `report`'s curves into the SVG file `path`.
pub(super) fn draw(report: &Value, path: &Path) -> Result<(), Box<dyn Error>> {
    let panels = panels(report);
    let rows = panels.len().div_ceil(2).max(1);
    let height = u32::try_from(rows).unwrap_or(1).saturating_mul(400);
    let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE)?;
    for (panel, area) in panels.iter().zip(root.split_evenly((rows, 2))) {
        draw_panel(panel, &area)?;
    }
    root.present()?;
    Ok(())
}

fn draw_panel(
    panel: &Panel,
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
) -> Result<(), Box<dyn Error>> {
    let all = panel.lines.iter().flat_map(|l| &l.points);
    let (mut low, mut high, mut top) = (f64::INFINITY, 0f64, 0f64);
    for &(x, y) in all {
        low = low.min(x);
        high = high.max(x);
        top = top.max(y);
    }
    if !low.is_finite() || low <= 0.0 {
        (low, high) = (1.0, 10.0);
    }
    // A log axis needs room on both sides of a single size.
    let (low, high) = (low / 1.5, high * 1.5);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((low..high).log_scale(), 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc(panel.x)
        .y_desc(panel.y)
        .x_label_formatter(&|x| tick(*x))
        .y_label_formatter(&|y| tick(*y))
        .draw()?;
    for line in panel.lines.iter().filter(|l| !l.points.is_empty()) {
        let colour = line.colour;
        chart
            .draw_series(
                LineSeries::new(line.points.clone(), colour.stroke_width(2)).point_size(3),
            )?
            .label(line.label)
            .legend(move |(x, y)| {
                PathElement::new(
                    vec![(x, y), (x.saturating_add(20), y)],
                    colour.stroke_width(2),
                )
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
