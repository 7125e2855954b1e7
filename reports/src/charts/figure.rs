//! XY figures: a title, one legend, and one or more panels side by side. Used for EP scaling
//! (log2 EP size), latency CDFs and sweeps (the swept value, log2 or linear or categorical).

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{
    Chart, DrawResult, GRID, INK, KeyedAxis, LegendEntry, Shape, axis_desc_style, draw_header,
    fmt_tick, label_style,
};

#[derive(Debug, Clone, PartialEq)]
pub enum SeriesStyle {
    Line,
    /// Line through the points, and a marker on each.
    LineMarkers(Shape),
    Markers(Shape),
}

#[derive(Debug, Clone, PartialEq)]
pub struct XySeries {
    pub color: RGBColor,
    pub style: SeriesStyle,
    /// (x position on the axis, y); for log axes the position is already log2(x).
    pub points: Vec<(f64, f64)>,
}

/// Tick marks at given positions with given labels (a log2 axis labelled with the real
/// values, or categories); `None` lets plotters choose.
pub type Ticks = Option<Vec<(f64, String)>>;

#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub x_desc: String,
    pub y_desc: String,
    pub x_ticks: Ticks,
    /// Fixed y range; `None` = from 0 to the data's maximum plus headroom.
    pub y_range: Option<(f64, f64)>,
    /// Panel caption drawn above the plot (e.g. "dispatch").
    pub caption: String,
    pub series: Vec<XySeries>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub title: String,
    pub subtitle: String,
    pub legend: Vec<LegendEntry>,
    pub panels: Vec<Panel>,
    /// Panels per row (rows follow).
    pub columns: usize,
    /// Height of one row of panels.
    pub panel_height: u32,
}

impl Chart for Figure {
    fn size(&self) -> (u32, u32) {
        let legend_rows = (self.legend.len() as u32).div_ceil(2);
        let panel_rows = self.panels.len().div_ceil(self.columns.max(1)) as u32;
        (1200, 130 + legend_rows * 24 + panel_rows * self.panel_height)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static,
    {
        let body = draw_header(root, &self.title, &self.subtitle, &self.legend)?;
        let columns = self.columns.clamp(1, self.panels.len().max(1));
        let areas = body.split_evenly((self.panels.len().div_ceil(columns).max(1), columns));
        for (panel, area) in self.panels.iter().zip(&areas) {
            draw_panel(panel, area)?;
        }
        Ok(())
    }
}

fn data_range(values: impl Iterator<Item = f64> + Clone) -> Option<(f64, f64)> {
    let lo = values.clone().min_by(f64::total_cmp)?;
    let hi = values.max_by(f64::total_cmp)?;
    Some((lo, hi))
}

fn draw_panel<DB: DrawingBackend>(panel: &Panel, area: &DrawingArea<DB, Shift>) -> DrawResult
where
    DB::ErrorType: 'static,
{
    let xs = panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let tick_xs = panel.x_ticks.iter().flatten().map(|t| t.0);
    let (x_lo, x_hi) = data_range(xs.chain(tick_xs)).unwrap_or((0.0, 1.0));
    let pad = if x_hi > x_lo { (x_hi - x_lo) * 0.06 } else { 0.5 };
    let (x_lo, x_hi) = (x_lo - pad, x_hi + pad);
    let (y_lo, y_hi) = panel.y_range.unwrap_or_else(|| {
        let ys = panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        let hi = data_range(ys).map_or(1.0, |r| r.1);
        (0.0, if hi > 0.0 { hi * 1.12 } else { 1.0 })
    });
    let area = if panel.caption.is_empty() {
        area.clone()
    } else {
        area.titled(&panel.caption, axis_desc_style())?
    };
    let key_points: Vec<f64> = match &panel.x_ticks {
        Some(t) => t.iter().map(|t| t.0).collect(),
        None => Vec::new(),
    };
    let tick_labels = panel.x_ticks.clone().unwrap_or_default();
    let mut builder = ChartBuilder::on(&area);
    builder.margin(12).margin_right(24).x_label_area_size(56).y_label_area_size(78);
    let x_axis: Box<dyn Fn(&f64) -> String> = if panel.x_ticks.is_some() {
        Box::new(move |x: &f64| {
            tick_labels
                .iter()
                .find(|(p, _)| (p - x).abs() < 1e-9)
                .map(|(_, l)| l.clone())
                .unwrap_or_default()
        })
    } else {
        Box::new(|x: &f64| fmt_tick(*x))
    };
    // WithKeyPoints only when ticks are given: plotters' own tick choice is better otherwise.
    macro_rules! finish {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .max_light_lines(1)
                .light_line_style(GRID)
                .bold_line_style(GRID)
                .axis_style(INK)
                .x_desc(&panel.x_desc)
                .y_desc(&panel.y_desc)
                .axis_desc_style(axis_desc_style())
                .label_style(label_style())
                .x_label_formatter(&x_axis)
                .y_label_formatter(&|y| fmt_tick(*y))
                .draw()?;
            for s in &panel.series {
                let line = matches!(s.style, SeriesStyle::Line | SeriesStyle::LineMarkers(_));
                if line && s.points.len() > 1 {
                    chart.draw_series(LineSeries::new(
                        s.points.iter().copied(),
                        s.color.stroke_width(3),
                    ))?;
                }
                let shape = match s.style {
                    SeriesStyle::LineMarkers(shape) | SeriesStyle::Markers(shape) => Some(shape),
                    SeriesStyle::Line => None,
                };
                if let Some(shape) = shape {
                    let size = if matches!(s.style, SeriesStyle::Markers(_)) { 6 } else { 4 };
                    let c = s.color;
                    for &p in &s.points {
                        match shape {
                            Shape::Circle => chart.draw_series([
                                EmptyElement::at(p) + Circle::new((0, 0), size, c.filled())
                            ])?,
                            Shape::Triangle => chart.draw_series([EmptyElement::at(p)
                                + TriangleMarker::new((0, 0), size + 2, c.filled())])?,
                            Shape::Cross => chart
                                .draw_series([EmptyElement::at(p)
                                    + Cross::new((0, 0), size, c.stroke_width(2))])?,
                            Shape::Square => chart.draw_series([EmptyElement::at(p)
                                + Rectangle::new([(-size, -size), (size, size)], c.filled())])?,
                        };
                    }
                }
            }
        }};
    }
    if key_points.is_empty() {
        finish!(builder.build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)?);
    } else {
        finish!(builder.build_cartesian_2d(KeyedAxis::new(x_lo, x_hi, key_points), y_lo..y_hi)?);
    }
    Ok(())
}
