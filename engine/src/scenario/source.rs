//! Where each key of a scenario file stands, so every diagnostic can name `file:line:col`.
//!
//! The scenario structs stay plain serde types; positions come from a second, span-keeping parse
//! (`toml::de::DeTable`) indexed by key path (`job[1].buffer.num_qps_per_rank`).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use toml::de::{DeTable, DeValue};

/// A position in a scenario file, 1-based line and column (columns count characters).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Location {
    pub file: String,
    pub line: usize,
    pub col: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// Key paths of one scenario text and the byte ranges of their keys and values.
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    file: String,
    text: String,
    key_spans: BTreeMap<String, Range<usize>>,
    /// Every key's and value's span with its key path, for naming the key at an offset.
    spans: Vec<(Range<usize>, String)>,
    /// Byte offset where each line starts: a location is a binary search, not a scan of the
    /// text (validation of many jobs resolves many locations).
    line_starts: Vec<usize>,
    /// The directory `file` is relative to when it is not the process's working directory
    /// (a test harness names bundled scenarios `scenarios/x.toml` from another directory):
    /// the files a scenario names (`routing_file`) are read from there.
    root: Option<std::path::PathBuf>,
}

impl SourceMap {
    /// Index `text`. A text that does not parse gets an empty index (positions then come from
    /// the parse error itself).
    pub fn new(file: impl Into<String>, text: impl Into<String>) -> Self {
        let text = text.into();
        let mut index = Index::default();
        if let Ok(root) = DeTable::parse(&text) {
            index_table(root.get_ref(), "", &mut index);
        }
        let line_starts =
            std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        SourceMap {
            file: file.into(),
            text,
            key_spans: index.keys,
            spans: index.spans,
            line_starts,
            root: None,
        }
    }

    /// `file` (and every relative path derived from it) is relative to `root`.
    pub fn set_root(&mut self, root: impl Into<std::path::PathBuf>) {
        self.root = Some(root.into());
    }

    /// Where a path derived from `file` is on disk: under the root when one is set and the
    /// path is relative, else the path itself.
    pub fn on_disk(&self, path: &std::path::Path) -> std::path::PathBuf {
        match &self.root {
            Some(root) if path.is_relative() => root.join(path),
            _ => path.to_path_buf(),
        }
    }

    /// The key path written at byte `offset`: the innermost key or value whose span holds it
    /// (`job[0].workload.tokens_per_rank` for an offset inside `128`). `None` when the text
    /// did not parse as TOML or the offset is outside every key and value.
    pub fn path_at(&self, offset: usize) -> Option<&str> {
        self.spans
            .iter()
            .filter(|(span, _)| span.start <= offset && offset < span.end.max(span.start + 1))
            .min_by_key(|(span, _)| span.end - span.start)
            .map(|(_, path)| path.as_str())
    }

    pub fn file(&self) -> &str {
        &self.file
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// The location of `path`, or of its nearest ancestor that is written in the file (a key
    /// that takes its default points at its table). The file's start when nothing matches.
    pub fn locate(&self, path: &str) -> Location {
        let mut probe = path.to_string();
        loop {
            if let Some(span) = self.key_spans.get(&probe) {
                return self.location_of(span.start);
            }
            match parent_path(&probe) {
                Some(parent) => probe = parent,
                None => return self.location_of(0),
            }
        }
    }

    /// Line and column of a byte offset.
    pub fn location_of(&self, offset: usize) -> Location {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.line_starts.partition_point(|&start| start <= offset);
        let line_start = self.line_starts[line - 1];
        let col = self.text[line_start..offset].chars().count() + 1;
        Location { file: self.file.clone(), line, col }
    }

    /// Whether the file writes this key (as opposed to taking a default).
    pub fn has(&self, path: &str) -> bool {
        self.key_spans.contains_key(path)
    }
}

fn parent_path(path: &str) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    if path.ends_with(']') {
        return path.rfind('[').map(|i| path[..i].to_string());
    }
    Some(path.rfind('.').map_or(String::new(), |i| path[..i].to_string()))
}

#[derive(Default)]
struct Index {
    keys: BTreeMap<String, Range<usize>>,
    spans: Vec<(Range<usize>, String)>,
}

fn index_table(table: &DeTable<'_>, prefix: &str, out: &mut Index) {
    for (key, value) in table.iter() {
        let path = if prefix.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{prefix}.{}", key.get_ref())
        };
        out.keys.insert(path.clone(), key.span());
        out.spans.push((key.span(), path.clone()));
        if !value.span().is_empty() {
            out.spans.push((value.span(), path.clone()));
        }
        index_value(value.get_ref(), &path, value.span(), out);
    }
}

fn index_value(value: &DeValue<'_>, path: &str, span: Range<usize>, out: &mut Index) {
    match value {
        DeValue::Table(table) => index_table(table, path, out),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let item_path = format!("{path}[{i}]");
                // Array-of-tables items have no key of their own: point at the item.
                let item_span = if item.span().is_empty() { span.clone() } else { item.span() };
                out.keys.insert(item_path.clone(), item_span.clone());
                if !item.span().is_empty() {
                    out.spans.push((item.span(), item_path.clone()));
                }
                index_value(item.get_ref(), &item_path, item_span, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "schema = 1\nname = \"x\"\n\n[cluster]\nprofile = \"h800-cx7\"\n\n[[job]]\nname = \"a\"\n[job.buffer]\nnum_sms = 21\n\n[[job]]\nname = \"b\"\n";

    #[test]
    fn locates_keys_and_falls_back_to_tables() {
        let map = SourceMap::new("s.toml", TEXT);
        assert_eq!(map.locate("cluster.profile").to_string(), "s.toml:5:1");
        assert_eq!(map.locate("job[0].buffer.num_sms").to_string(), "s.toml:10:1");
        // Not written: falls back to the table header's key.
        let loc = map.locate("job[0].buffer.num_qps_per_rank");
        assert_eq!(loc.line, 9);
        let loc = map.locate("job[1].name");
        assert_eq!(loc.line, 13);
        assert_eq!(map.locate("nothing.here").line, 1);
    }

    #[test]
    fn locations_count_lines_and_characters() {
        let map = SourceMap::new("s.toml", "a = 1\nb = \"é\" # x\n\nc = 2");
        assert_eq!(map.location_of(0).to_string(), "s.toml:1:1");
        assert_eq!(map.location_of(6).to_string(), "s.toml:2:1");
        // After the two-byte 'é': column counts characters.
        assert_eq!(map.location_of(13).col, 7);
        // An offset inside a character and one past the end stay in range.
        assert_eq!(map.location_of(11).col, 6);
        assert_eq!(map.location_of(10_000).to_string(), "s.toml:4:6");
    }

    #[test]
    fn names_the_key_at_an_offset() {
        let map = SourceMap::new("s.toml", TEXT);
        let at = |needle: &str| map.path_at(TEXT.find(needle).unwrap()).map(str::to_string);
        assert_eq!(at("21").as_deref(), Some("job[0].buffer.num_sms"));
        assert_eq!(at("num_sms").as_deref(), Some("job[0].buffer.num_sms"));
        assert_eq!(at("\"b\"").as_deref(), Some("job[1].name"));
        assert_eq!(at("\"h800-cx7\"").as_deref(), Some("cluster.profile"));
        assert!(SourceMap::new("s.toml", "a = [").path_at(0).is_none());
    }

    /// Paths a scenario names are read under its root when it has one (a harness running
    /// elsewhere), and as they are otherwise or when absolute.
    #[test]
    fn paths_are_read_under_the_root() {
        let rel = std::path::Path::new("scenarios/../results/r.json");
        let mut m = SourceMap::new("scenarios/x.toml", "schema = 1\n");
        assert_eq!(m.on_disk(rel), rel);
        m.set_root("/repo");
        assert_eq!(m.on_disk(rel), std::path::Path::new("/repo/scenarios/../results/r.json"));
        assert_eq!(
            m.on_disk(std::path::Path::new("/abs/r.json")),
            std::path::Path::new("/abs/r.json")
        );
    }
}
