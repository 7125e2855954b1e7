//! Drawing: every chart is drawn once per backend (PNG and SVG) from the same code, with the
//! embedded DejaVu Sans (no system fonts: plotters' `ab_glyph` feature).

pub mod bars;
pub mod figure;
pub mod gantt;

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::ReportError;

/// The family name charts ask for; the embedded font is registered under it.
pub const FONT: &str = "sans-serif";
static FONT_BYTES: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// Register the embedded font with plotters (once per process).
pub fn register_font() -> Result<(), ReportError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok()
    });
    if ok { Ok(()) } else { Err(ReportError::Font) }
}

pub type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Something that can draw itself on any plotters backend.
pub trait Chart {
    /// Pixel size of the PNG (the SVG uses the same user units).
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult
    where
        DB::ErrorType: 'static;
}

/// A chart drawn as PNG and SVG bytes, in memory: the report writes them through the one
/// output writer (engine/src/files.rs), which replaces regular files only and atomically.
pub struct Drawn {
    pub png: Vec<u8>,
    pub svg: Vec<u8>,
}

/// Draw `chart` (its id `stem` names it in errors; `png` and `svg` are the paths it will be
/// written to).
pub fn render(
    chart: &impl Chart,
    stem: &str,
    png: &Path,
    svg: &Path,
) -> Result<Drawn, ReportError> {
    register_font()?;
    let (width, height) = chart.size();
    let draw_err = |path: &Path, e: Box<dyn std::error::Error>| ReportError::Draw {
        chart: stem.to_string(),
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut rgb = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(png, e.into()))?;
        chart.draw(&root).map_err(|e| draw_err(png, e))?;
        root.present().map_err(|e| draw_err(png, e.into()))?;
    }
    let mut png_bytes = Vec::new();
    {
        let mut encoder = ::png::Encoder::new(&mut png_bytes, width, height);
        encoder.set_color(::png::ColorType::Rgb);
        encoder.set_depth(::png::BitDepth::Eight);
        let encoded = encoder.write_header().and_then(|mut w| w.write_image_data(&rgb));
        encoded.map_err(|e| draw_err(png, e.into()))?;
    }
    let mut svg_text = String::new();
    {
        let root = SVGBackend::with_string(&mut svg_text, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(svg, e.into()))?;
        chart.draw(&root).map_err(|e| draw_err(svg, e))?;
        root.present().map_err(|e| draw_err(svg, e.into()))?;
    }
    Ok(Drawn { png: png_bytes, svg: svg_text.into_bytes() })
}

// Okabe–Ito colours: distinguishable with the common colour-vision deficiencies.
pub const SIM: RGBColor = RGBColor(0, 114, 178);
pub const MEASURED: RGBColor = RGBColor(213, 94, 0);
pub const PUBLISHED: RGBColor = RGBColor(90, 90, 90);
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(0, 0, 0),
];
pub const INK: RGBColor = RGBColor(40, 40, 40);
pub const GRID: RGBColor = RGBColor(225, 225, 225);

/// A linear f64 axis whose ticks sit exactly at given positions (EP sizes, swept values, bar
/// rows). plotters' `WithKeyPoints` cannot take a label formatter, hence this small type.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedAxis {
    pub lo: f64,
    pub hi: f64,
    pub keys: Vec<f64>,
}

impl KeyedAxis {
    pub fn new(lo: f64, hi: f64, keys: Vec<f64>) -> Self {
        KeyedAxis { lo, hi, keys }
    }
}

impl plotters::coord::ranged1d::Ranged for KeyedAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        if self.hi == self.lo {
            return (limit.0 + limit.1) / 2;
        }
        let fraction = (value - self.lo) / (self.hi - self.lo);
        limit.0 + ((limit.1 - limit.0) as f64 * fraction + 1e-3).floor() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Bold (labelled) points only: light grid lines between them would carry no value.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.keys.iter().copied().filter(|k| *k >= self.lo && *k <= self.hi).collect()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

pub fn palette(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

pub fn title_style() -> TextStyle<'static> {
    (FONT, 24).into_font().color(&INK)
}
pub fn subtitle_style() -> TextStyle<'static> {
    (FONT, 15).into_font().color(&RGBColor(90, 90, 90))
}
pub fn label_style() -> TextStyle<'static> {
    (FONT, 14).into_font().color(&INK)
}
pub fn axis_desc_style() -> TextStyle<'static> {
    (FONT, 16).into_font().color(&INK)
}
pub fn small_style() -> TextStyle<'static> {
    (FONT, 12).into_font().color(&INK)
}

/// Marker shapes; backends and sources get different shapes so that a chart reads in
/// black and white too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Circle,
    Triangle,
    Cross,
    Square,
}

/// How a legend entry is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mark {
    Bar(RGBColor),
    Line(RGBColor),
    LineMarker(RGBColor, Shape),
    Marker(RGBColor, Shape),
}

#[derive(Debug, Clone, PartialEq)]
pub struct LegendEntry {
    pub label: String,
    pub mark: Mark,
}

impl LegendEntry {
    pub fn new(label: impl Into<String>, mark: Mark) -> Self {
        LegendEntry { label: label.into(), mark }
    }
}

pub fn draw_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    at: (i32, i32),
    color: RGBColor,
    shape: Shape,
    size: i32,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    match shape {
        Shape::Circle => area.draw(&Circle::new(at, size, color.filled()))?,
        Shape::Triangle => area.draw(&TriangleMarker::new(at, size + 2, color.filled()))?,
        Shape::Cross => area.draw(&Cross::new(at, size, color.stroke_width(2)))?,
        Shape::Square => area.draw(&Rectangle::new(
            [(at.0 - size, at.1 - size), (at.0 + size, at.1 + size)],
            color.filled(),
        ))?,
    }
    Ok(())
}

/// Lines of text wrapped to `max_width` pixels.
fn wrap<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    text: &str,
    style: &TextStyle,
    max_width: u32,
) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let candidate = if line.is_empty() { word.to_string() } else { format!("{line} {word}") };
        let width = area.estimate_text_size(&candidate, style).map(|s| s.0).unwrap_or(0);
        if width > max_width && !line.is_empty() {
            lines.push(std::mem::replace(&mut line, word.to_string()));
        } else {
            line = candidate;
        }
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// Height the header takes for this title, subtitle and legend at `width` pixels.
pub fn header_height<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    legend: &[LegendEntry],
) -> u32 {
    let width = area.dim_in_pixel().0.saturating_sub(40);
    let title_lines = wrap(area, title, &title_style(), width).len() as u32;
    let sub_lines = wrap(area, subtitle, &subtitle_style(), width).len() as u32;
    let legend_rows = legend_layout(area, legend, width).last().map_or(0, |e| e.1 + 1);
    14 + title_lines * 30 + sub_lines * 20 + 8 + legend_rows as u32 * 24 + 6
}

/// (entry index, row, x offset) for a legend laid out left to right, wrapping at `width`.
fn legend_layout<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    legend: &[LegendEntry],
    width: u32,
) -> Vec<(usize, usize, u32)> {
    let style = label_style();
    let mut out = Vec::new();
    let (mut row, mut x) = (0usize, 0u32);
    for (i, e) in legend.iter().enumerate() {
        let w = 34 + area.estimate_text_size(&e.label, &style).map(|s| s.0).unwrap_or(0) + 22;
        if x > 0 && x + w > width {
            row += 1;
            x = 0;
        }
        out.push((i, row, x));
        x += w;
    }
    out
}

/// Draw title, subtitle and legend at the top of `root`; returns the area below them.
pub fn draw_header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    legend: &[LegendEntry],
) -> Result<DrawingArea<DB, Shift>, Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let height = header_height(root, title, subtitle, legend);
    let (head, body) = root.split_vertically(height);
    let width = head.dim_in_pixel().0.saturating_sub(40);
    let mut y = 14i32;
    for line in wrap(&head, title, &title_style(), width) {
        head.draw_text(&line, &title_style(), (20, y))?;
        y += 30;
    }
    for line in wrap(&head, subtitle, &subtitle_style(), width) {
        head.draw_text(&line, &subtitle_style(), (20, y))?;
        y += 20;
    }
    y += 8;
    for (i, row, x) in legend_layout(&head, legend, width) {
        let e = &legend[i];
        let (x0, yc) = (20 + x as i32, y + row as i32 * 24 + 8);
        match e.mark {
            Mark::Bar(c) => {
                head.draw(&Rectangle::new([(x0, yc - 6), (x0 + 26, yc + 6)], c.filled()))?
            }
            Mark::Line(c) => {
                head.draw(&PathElement::new(vec![(x0, yc), (x0 + 26, yc)], c.stroke_width(3)))?
            }
            Mark::LineMarker(c, s) => {
                head.draw(&PathElement::new(vec![(x0, yc), (x0 + 26, yc)], c.stroke_width(3)))?;
                draw_marker(&head, (x0 + 13, yc), c, s, 4)?;
            }
            Mark::Marker(c, s) => draw_marker(&head, (x0 + 13, yc), c, s, 5)?,
        }
        head.draw_text(&e.label, &label_style(), (x0 + 34, yc - 8))?;
    }
    Ok(body)
}

/// A short number: 3 significant digits, no exponent for the values charts show.
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// An axis tick: as few digits as the value needs (`20`, `2.5`, `0.25`).
pub fn fmt_tick(v: f64) -> String {
    if v.abs() >= 1000.0 || v == v.round() {
        return format!("{v:.0}");
    }
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

pub fn fmt_pct(v: f64) -> String {
    format!("{v:+.1} %")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_short() {
        assert_eq!(fmt_num(1234.5), "1234");
        assert_eq!(fmt_num(77.04), "77.0");
        assert_eq!(fmt_num(3.456), "3.46");
        assert_eq!(fmt_num(0.01234), "0.012");
        assert_eq!(fmt_pct(-3.04), "-3.0 %");
        assert_eq!(fmt_tick(20.0), "20");
        assert_eq!(fmt_tick(2.5), "2.5");
        assert_eq!(fmt_tick(0.25), "0.25");
        assert_eq!(fmt_tick(0.1 + 0.2), "0.3");
    }

    #[test]
    fn font_registers() {
        register_font().unwrap();
        register_font().unwrap();
    }
}
