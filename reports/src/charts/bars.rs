//! Grouped horizontal bars: one row per (scenario, op), one bar per source (simulator,
//! measured, published), an optional whisker per bar, and a note (the error %) per row.
//! Horizontal because row labels are scenario names, which do not fit under vertical bars.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{
    Chart, DrawResult, GRID, INK, KeyedAxis, LegendEntry, Mark, axis_desc_style, draw_header,
    fmt_num, fmt_tick, label_style, small_style,
};

#[derive(Debug, Clone, PartialEq)]
pub struct BarSeries {
    pub label: String,
    pub color: RGBColor,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BarRow {
    pub label: String,
    /// One value per series (`None`: this source has no number for the row).
    pub values: Vec<Option<f64>>,
    /// Spread per series, drawn as a thin line (e.g. min..p99 of the samples).
    pub whiskers: Vec<Option<(f64, f64)>>,
    /// Text right of the row's bars (the error %).
    pub note: Option<String>,
    /// Draw the note in the alert colour (outside the tolerance).
    pub alert: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GroupedBars {
    pub title: String,
    pub subtitle: String,
    /// Value axis description with its unit.
    pub x_desc: String,
    pub series: Vec<BarSeries>,
    pub rows: Vec<BarRow>,
}

const ALERT: RGBColor = RGBColor(190, 30, 30);

impl GroupedBars {
    fn row_height(&self) -> u32 {
        (self.series.len() as u32 * 18 + 16).max(34)
    }
}

impl Chart for GroupedBars {
    fn size(&self) -> (u32, u32) {
        let header = 120 + 24 * (self.series.len() as u32).div_ceil(2);
        (1200, (header + 90 + self.rows.len() as u32 * self.row_height()).max(360))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let legend: Vec<LegendEntry> =
            self.series.iter().map(|s| LegendEntry::new(&s.label, Mark::Bar(s.color))).collect();
        let body = draw_header(root, &self.title, &self.subtitle, &legend)?;
        let n = self.rows.len().max(1);
        let max_value = self
            .rows
            .iter()
            .flat_map(|r| {
                r.values.iter().flatten().copied().chain(r.whiskers.iter().flatten().map(|w| w.1))
            })
            .fold(0.0f64, f64::max);
        let label_width = self
            .rows
            .iter()
            .map(|r| body.estimate_text_size(&r.label, &label_style()).map(|s| s.0).unwrap_or(0))
            .max()
            .unwrap_or(0)
            + 24;
        // Leave room right of the longest bar for its value and the row's note: the value axis
        // ends where the widest (bar end + texts) fits, in pixels of the plot.
        let plot_px = body.dim_in_pixel().0.saturating_sub(label_width + 50).max(200) as f64;
        let text_px = |t: &str, style: &TextStyle| {
            body.estimate_text_size(t, style).map(|s| s.0).unwrap_or(0) as f64
        };
        // Values that span more than 20x (128 and 4096 tokens in one chart) go on a log axis,
        // so the short bars stay readable; the labels carry the exact numbers either way.
        let min_positive = self
            .rows
            .iter()
            .flat_map(|r| {
                r.values.iter().flatten().copied().chain(r.whiskers.iter().flatten().map(|w| w.0))
            })
            .filter(|v| *v > 0.0)
            .fold(f64::MAX, f64::min);
        let log = max_value > 0.0 && min_positive < f64::MAX && max_value / min_positive > 20.0;
        let lo = if log { (min_positive.log10() - 0.15).floor() } else { 0.0 };
        let tx = |v: f64| if log { v.max(10f64.powf(lo)).log10() } else { v };
        let mut x_max = lo;
        for row in &self.rows {
            let end = row
                .values
                .iter()
                .flatten()
                .copied()
                .chain(row.whiskers.iter().flatten().map(|w| w.1))
                .fold(0.0f64, f64::max);
            let value_px = row
                .values
                .iter()
                .flatten()
                .map(|v| text_px(&fmt_num(*v), &small_style()))
                .fold(0.0, f64::max);
            let note_px = row.note.as_deref().map_or(0.0, |n| text_px(n, &label_style()));
            let reserved = (value_px + 8.0 + note_px + 24.0).min(plot_px * 0.7);
            x_max = x_max.max(lo + (tx(end) - lo) / (1.0 - reserved / plot_px));
        }
        let x_max = if x_max > lo && max_value > 0.0 { lo + (x_max - lo) * 1.02 } else { lo + 1.0 };
        let ticks = if log { log_ticks(lo, x_max) } else { linear_ticks(x_max) };
        let x_desc = if log { format!("{} (log scale)", self.x_desc) } else { self.x_desc.clone() };
        let centers: Vec<f64> = (0..n).map(|i| n as f64 - i as f64 - 0.5).collect();
        let labels: Vec<(f64, String)> =
            self.rows.iter().enumerate().map(|(i, r)| (centers[i], r.label.clone())).collect();
        let mut chart = ChartBuilder::on(&body)
            .margin_left(10)
            .margin_right(30)
            .margin_bottom(10)
            .x_label_area_size(50)
            .y_label_area_size(label_width)
            .build_cartesian_2d(
                KeyedAxis::new(lo, x_max, ticks),
                KeyedAxis::new(0.0, n as f64, centers.clone()),
            )?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .max_light_lines(1)
            .light_line_style(GRID)
            .bold_line_style(GRID)
            .axis_style(INK)
            .x_desc(&x_desc)
            .axis_desc_style(axis_desc_style())
            .label_style(label_style())
            .x_label_formatter(&|v| {
                if log { fmt_tick(round_tick(10f64.powf(*v))) } else { fmt_tick(*v) }
            })
            .y_label_formatter(&|y| {
                labels
                    .iter()
                    .find(|(c, _)| (c - y).abs() < 1e-6)
                    .map(|(_, l)| l.clone())
                    .unwrap_or_default()
            })
            .draw()?;
        let k = self.series.len().max(1) as f64;
        let band = 0.8 / k;
        let per_px = (x_max - lo) / plot_px;
        for (i, row) in self.rows.iter().enumerate() {
            let row_value_px = row
                .values
                .iter()
                .flatten()
                .map(|v| text_px(&fmt_num(*v), &small_style()))
                .fold(0.0, f64::max);
            let top = centers[i] + 0.4;
            let mut row_end = lo;
            for (s, series) in self.series.iter().enumerate() {
                let y1 = top - band * s as f64 - band * 0.08;
                let y0 = top - band * (s as f64 + 1.0) + band * 0.08;
                let yc = (y0 + y1) / 2.0;
                let Some(v) = row.values.get(s).copied().flatten() else { continue };
                chart.draw_series([Rectangle::new(
                    [(lo, y0), (tx(v), y1)],
                    series.color.filled(),
                )])?;
                let mut end = tx(v);
                if let Some((w0, w1)) = row.whiskers.get(s).copied().flatten() {
                    let (w0, w1) = (tx(w0), tx(w1));
                    let cap = band * 0.25;
                    chart.draw_series([
                        PathElement::new(vec![(w0, yc), (w1, yc)], INK.stroke_width(1)),
                        PathElement::new(vec![(w0, yc - cap), (w0, yc + cap)], INK.stroke_width(1)),
                        PathElement::new(vec![(w1, yc - cap), (w1, yc + cap)], INK.stroke_width(1)),
                    ])?;
                    end = end.max(w1);
                }
                chart.draw_series([Text::new(
                    fmt_num(v),
                    (end + per_px * 4.0, yc),
                    small_style().pos(Pos::new(HPos::Left, VPos::Center)),
                )])?;
                row_end = row_end.max(end);
            }
            if let Some(note) = &row.note {
                let style = label_style().pos(Pos::new(HPos::Left, VPos::Center));
                let style = if row.alert { style.color(&ALERT) } else { style };
                chart.draw_series([Text::new(
                    note.clone(),
                    (row_end + per_px * (row_value_px + 16.0), centers[i]),
                    style,
                )])?;
            }
        }
        Ok(())
    }
}

/// Round numbers up to `hi` (about eight of them) for a linear axis from zero.
fn linear_ticks(hi: f64) -> Vec<f64> {
    if hi <= 0.0 {
        return vec![0.0];
    }
    let raw = hi / 8.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step =
        [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(raw);
    (0..).map(|i| i as f64 * step).take_while(|t| *t <= hi + step * 1e-9).collect()
}

/// 1-2-5 steps of every decade between `lo` and `hi` (both log10).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    for decade in (lo.floor() as i32)..=(hi.ceil() as i32) {
        for m in [1.0f64, 2.0, 5.0] {
            let t = (m * 10f64.powi(decade)).log10();
            if t >= lo - 1e-9 && t <= hi + 1e-9 {
                ticks.push(t);
            }
        }
    }
    ticks
}

/// 10^log10(200) is 199.99999999999997: put tick values back on the number they name.
fn round_tick(v: f64) -> f64 {
    let magnitude = 10f64.powf(v.log10().floor() - 2.0);
    (v / magnitude).round() * magnitude
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks() {
        assert_eq!(linear_ticks(4200.0), [0.0, 1000.0, 2000.0, 3000.0, 4000.0]);
        assert_eq!(linear_ticks(390.0), [0.0, 50.0, 100.0, 150.0, 200.0, 250.0, 300.0, 350.0]);
        assert_eq!(linear_ticks(1.0).len(), 6);
        let t: Vec<f64> = log_ticks(1.0, 3.6).iter().map(|t| round_tick(10f64.powf(*t))).collect();
        assert_eq!(t, [10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]);
        assert_eq!(fmt_tick(round_tick(10f64.powf(2f64.log10() + 2.0))), "200");
    }
}
