//! A Gantt timeline: one row per trace lane (GPU, NIC, link), one box per busy interval,
//! coloured by the event's category.

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{
    Chart, DrawResult, GRID, INK, KeyedAxis, LegendEntry, Mark, axis_desc_style, draw_header,
    fmt_tick, label_style, small_style,
};

#[derive(Debug, Clone, PartialEq)]
pub struct GanttRow {
    pub label: String,
    /// (start, end, category index), in the chart's time unit.
    pub boxes: Vec<(f64, f64, usize)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gantt {
    pub title: String,
    pub subtitle: String,
    pub x_desc: String,
    pub x_range: (f64, f64),
    pub categories: Vec<(String, RGBColor)>,
    pub rows: Vec<GanttRow>,
}

const ROW_PX: u32 = 22;

impl Chart for Gantt {
    fn size(&self) -> (u32, u32) {
        let legend_rows = (self.categories.len() as u32).div_ceil(4);
        (1200, (170 + legend_rows * 24 + 70 + self.rows.len() as u32 * ROW_PX).max(360))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let legend: Vec<LegendEntry> =
            self.categories.iter().map(|(name, c)| LegendEntry::new(name, Mark::Bar(*c))).collect();
        let body = draw_header(root, &self.title, &self.subtitle, &legend)?;
        let n = self.rows.len().max(1);
        let centers: Vec<f64> = (0..n).map(|i| n as f64 - i as f64 - 0.5).collect();
        let labels: Vec<(f64, String)> =
            self.rows.iter().enumerate().map(|(i, r)| (centers[i], r.label.clone())).collect();
        let label_width = self
            .rows
            .iter()
            .map(|r| body.estimate_text_size(&r.label, &small_style()).map(|s| s.0).unwrap_or(0))
            .max()
            .unwrap_or(0)
            + 20;
        let (x0, x1) = self.x_range;
        let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
        let mut chart = ChartBuilder::on(&body)
            .margin_left(10)
            .margin_right(30)
            .margin_bottom(10)
            .x_label_area_size(50)
            .y_label_area_size(label_width)
            .build_cartesian_2d(x0..x1, KeyedAxis::new(0.0, n as f64, centers.clone()))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .max_light_lines(1)
            .light_line_style(GRID)
            .bold_line_style(GRID)
            .axis_style(INK)
            .x_desc(&self.x_desc)
            .axis_desc_style(axis_desc_style())
            .label_style(label_style())
            .y_label_style(small_style())
            .x_label_formatter(&|v| fmt_tick(*v))
            .y_label_formatter(&|y| {
                labels
                    .iter()
                    .find(|(c, _)| (c - y).abs() < 1e-6)
                    .map(|(_, l)| l.clone())
                    .unwrap_or_default()
            })
            .draw()?;
        // Row separators make long rows of short boxes easy to follow across the chart.
        chart.draw_series((1..n).map(|i| {
            PathElement::new(vec![(x0, i as f64), (x1, i as f64)], GRID.stroke_width(1))
        }))?;
        for (i, row) in self.rows.iter().enumerate() {
            let (lo, hi) = (centers[i] - 0.36, centers[i] + 0.36);
            // A box narrower than a pixel would vanish; short events still mark their place.
            let min_width = (x1 - x0) / 1500.0;
            chart.draw_series(row.boxes.iter().map(|&(s, e, cat)| {
                let e = e.max(s + min_width);
                let color = self.categories.get(cat).map_or(INK, |c| c.1);
                Rectangle::new([(s.max(x0), lo), (e.min(x1), hi)], color.filled())
            }))?;
        }
        Ok(())
    }
}
