//! Editing a scenario's TOML table along key paths: `cluster.nodes`, `job[0].workload.topk`
//! (a list entry by position), `job[decode].env.NVSHMEM_QP_DEPTH` (by its `name`). `eptwin
//! sweep` builds its points with it, and tests use it to derive scenarios from a base one:
//!
//! ```
//! use eptwin_engine::scenario::edit;
//! let mut table: toml::Table = toml::from_str("[[job]]\nname = \"decode\"\n").unwrap();
//! edit::set(&mut table, "job[decode].workload.tokens_per_rank", 128).unwrap();
//! edit::set(&mut table, "job[0].env.NVSHMEM_QP_DEPTH", "256").unwrap();
//! assert_eq!(edit::get(&table, "job[0].workload.tokens_per_rank").unwrap(), Some(&128.into()));
//! assert!(edit::set(&mut table, "job[prefill].env.X", "1").is_err());
//! ```
//!
//! Missing tables on the way are created; a list is entered only through `[..]` unless it has
//! exactly one entry. The result is checked against the schema only when it is parsed
//! ([`crate::parse`]).

use crate::error::EngineError;

/// One step of a key path: `job`, `job[0]` (by position), `job[decode]` (by `name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(String, usize),
    Named(String, String),
}

impl Segment {
    /// The table key the step enters.
    pub fn name(&self) -> &str {
        match self {
            Segment::Key(n) | Segment::Index(n, _) | Segment::Named(n, _) => n,
        }
    }
}

/// A parsed key path (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPath {
    key: String,
    segments: Vec<Segment>,
}

fn path_error(key: &str, message: String) -> EngineError {
    EngineError::KeyPath { key: key.to_string(), message }
}

impl KeyPath {
    pub fn parse(key: &str) -> Result<KeyPath, EngineError> {
        let mut segments = Vec::new();
        for part in key.split('.') {
            let segment = match part.split_once('[') {
                Some((name, rest)) => {
                    let inner = rest.strip_suffix(']').ok_or_else(|| {
                        path_error(key, format!("{part:?} opens '[' without closing it"))
                    })?;
                    match inner.parse::<usize>() {
                        Ok(i) => Segment::Index(name.to_string(), i),
                        Err(_) => Segment::Named(name.to_string(), inner.to_string()),
                    }
                }
                None => Segment::Key(part.to_string()),
            };
            if segment.name().is_empty() {
                return Err(path_error(key, "empty key segment".into()));
            }
            segments.push(segment);
        }
        Ok(KeyPath { key: key.to_string(), segments })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The value this path names in `table`, if it is there.
    pub fn get<'t>(&self, table: &'t toml::Table) -> Option<&'t toml::Value> {
        let (last, parents) = self.segments.split_last()?;
        let mut cur = table;
        for seg in parents {
            cur = match (cur.get(seg.name())?, seg) {
                (toml::Value::Table(t), Segment::Key(_)) => t,
                (toml::Value::Array(items), seg) => {
                    let index = match seg {
                        Segment::Index(_, i) => *i,
                        Segment::Named(_, wanted) => {
                            items.iter().position(|t| is_named(t, wanted))?
                        }
                        Segment::Key(_) if items.len() == 1 => 0,
                        Segment::Key(_) => return None,
                    };
                    items.get(index)?.as_table()?
                }
                _ => return None,
            };
        }
        let Segment::Key(name) = last else { return None };
        cur.get(name)
    }

    /// Put `value` at this path, creating missing tables on the way.
    pub fn set(&self, table: &mut toml::Table, value: toml::Value) -> Result<(), EngineError> {
        let (last, parents) = self.segments.split_last().expect("a path has a segment");
        let mut t = table;
        for seg in parents {
            t = self.step(t, seg)?;
        }
        match last {
            Segment::Key(name) => {
                t.insert(name.clone(), value);
                Ok(())
            }
            _ => Err(path_error(
                &self.key,
                "the last segment names a value, not a list entry".into(),
            )),
        }
    }

    /// The table a segment leads to (created when missing).
    fn step<'t>(
        &self,
        table: &'t mut toml::Table,
        seg: &Segment,
    ) -> Result<&'t mut toml::Table, EngineError> {
        let err = |message: String| path_error(&self.key, message);
        let name = seg.name();
        let entry =
            table.entry(name.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match (entry, seg) {
            (toml::Value::Table(t), Segment::Key(_)) => Ok(t),
            (toml::Value::Table(_), _) => {
                Err(err(format!("{name} is a table, not a list: drop the [..]")))
            }
            (toml::Value::Array(items), seg) => {
                let count = items.len();
                let index = match seg {
                    Segment::Index(_, i) => *i,
                    Segment::Named(_, wanted) => items
                        .iter()
                        .position(|t| is_named(t, wanted))
                        .ok_or_else(|| err(format!("no {name} is named {wanted:?}")))?,
                    Segment::Key(_) if count == 1 => 0,
                    Segment::Key(_) => {
                        return Err(err(format!(
                            "the scenario has {count} [[{name}]] entries: say {name}[0] or \
                             {name}[<name>]"
                        )));
                    }
                };
                match items.get_mut(index) {
                    Some(toml::Value::Table(t)) => Ok(t),
                    Some(_) => Err(err(format!("{name}[{index}] is not a table"))),
                    None => Err(err(format!("{name}[{index}] does not exist ({count} entries)"))),
                }
            }
            _ => Err(err(format!("{name} is a value, not a table"))),
        }
    }
}

fn is_named(entry: &toml::Value, wanted: &str) -> bool {
    entry.get("name").and_then(|n| n.as_str()) == Some(wanted)
}

/// Put `value` at `key` in `table` (see the module docs).
pub fn set(
    table: &mut toml::Table,
    key: &str,
    value: impl Into<toml::Value>,
) -> Result<(), EngineError> {
    KeyPath::parse(key)?.set(table, value.into())
}

/// The value at `key` in `table`; `Ok(None)` when nothing is there.
pub fn get<'t>(table: &'t toml::Table, key: &str) -> Result<Option<&'t toml::Value>, EngineError> {
    Ok(KeyPath::parse(key)?.get(table))
}

/// The TOML value a command-line string becomes: the type of the value it replaces
/// (`existing`), else a TOML literal (integer, float, boolean), else a string; always a string
/// with `as_string`. Errors say what the text is not.
pub fn value_from_text(
    raw: &str,
    existing: Option<&toml::Value>,
    as_string: bool,
) -> Result<toml::Value, String> {
    if as_string {
        return Ok(toml::Value::String(raw.to_string()));
    }
    let literal = || -> Option<toml::Value> {
        if let Ok(i) = raw.parse::<i64>() {
            return Some(toml::Value::Integer(i));
        }
        if let Ok(f) = raw.parse::<f64>() {
            return Some(toml::Value::Float(f));
        }
        raw.parse::<bool>().ok().map(toml::Value::Boolean)
    };
    Ok(match existing {
        Some(toml::Value::String(_)) => toml::Value::String(raw.to_string()),
        Some(toml::Value::Integer(_)) => {
            toml::Value::Integer(raw.parse().map_err(|_| format!("{raw:?} is not an integer"))?)
        }
        Some(toml::Value::Float(_)) => {
            toml::Value::Float(raw.parse().map_err(|_| format!("{raw:?} is not a number"))?)
        }
        Some(toml::Value::Boolean(_)) => {
            toml::Value::Boolean(raw.parse().map_err(|_| format!("{raw:?} is not true/false"))?)
        }
        Some(toml::Value::Array(_) | toml::Value::Table(_)) => {
            return Err("lists and tables cannot be swept; sweep one of their keys".into());
        }
        _ => literal().unwrap_or_else(|| toml::Value::String(raw.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
schema = 1
name = "t"
[cluster]
nodes = 2
[[job]]
name = "decode"
[job.env]
NVSHMEM_IB_SL = "1"
[[job]]
name = "bulk"
"#;

    fn base() -> toml::Table {
        toml::from_str(BASE).unwrap()
    }

    #[test]
    fn key_paths() {
        use Segment::*;
        assert_eq!(
            KeyPath::parse("job[0].buffer.num_qps_per_rank").unwrap().segments(),
            [Index("job".into(), 0), Key("buffer".into()), Key("num_qps_per_rank".into())]
        );
        assert_eq!(
            KeyPath::parse("job[decode].env.X").unwrap().segments()[0],
            Named("job".into(), "decode".into())
        );
        let e = KeyPath::parse("job[0.x").unwrap_err().to_string();
        assert_eq!(e, r#""job[0.x": "job[0" opens '[' without closing it"#);
        assert!(KeyPath::parse("cluster..nodes").unwrap_err().to_string().contains("empty"));
    }

    #[test]
    fn set_by_position_by_name_and_into_new_tables() {
        let mut t = base();
        set(&mut t, "cluster.nodes", 4).unwrap();
        set(&mut t, "job[decode].env.NVSHMEM_QP_DEPTH", "256").unwrap();
        set(&mut t, "job[1].traffic.pattern", "ring").unwrap();
        assert_eq!(get(&t, "cluster.nodes").unwrap(), Some(&toml::Value::Integer(4)));
        assert_eq!(get(&t, "job[0].env.NVSHMEM_QP_DEPTH").unwrap().unwrap().as_str(), Some("256"));
        assert_eq!(get(&t, "job[bulk].traffic.pattern").unwrap().unwrap().as_str(), Some("ring"));
        assert_eq!(get(&t, "job[bulk].env.NVSHMEM_QP_DEPTH").unwrap(), None, "other job untouched");
        assert_eq!(get(&t, "job.env.X").unwrap(), None, "two jobs: ambiguous, so absent");
    }

    #[test]
    fn bad_paths_name_the_path_and_the_problem() {
        let t = base();
        let err = |key: &str| set(&mut t.clone(), key, 1).unwrap_err().to_string();
        assert!(err("job.env.X").contains("2 [[job]] entries: say job[0] or job[<name>]"));
        assert!(err("job[7].env.X").contains("job[7] does not exist (2 entries)"));
        assert_eq!(err("job[nope].env.X"), r#""job[nope].env.X": no job is named "nope""#);
        assert!(err("cluster[0].nodes").contains("cluster is a table, not a list"));
        assert!(err("schema.x").contains("schema is a value, not a table"));
        assert!(err("job[0]").contains("the last segment names a value"));
        // A scenario with one job may leave the index out.
        let mut one: toml::Table = toml::from_str("[[job]]\nname = \"a\"\n").unwrap();
        set(&mut one, "job.env.X", "1").unwrap();
        assert_eq!(get(&one, "job.env.X").unwrap().unwrap().as_str(), Some("1"));
    }

    #[test]
    fn text_becomes_the_type_it_replaces() {
        let int = toml::Value::Integer(1);
        let text = toml::Value::String("x".into());
        assert_eq!(value_from_text("7", Some(&int), false), Ok(toml::Value::Integer(7)));
        assert_eq!(value_from_text("7", Some(&text), false), Ok(toml::Value::String("7".into())));
        assert_eq!(
            value_from_text("two", Some(&int), false),
            Err("\"two\" is not an integer".into())
        );
        assert_eq!(value_from_text("2.5", None, false), Ok(toml::Value::Float(2.5)));
        assert_eq!(value_from_text("true", None, false), Ok(toml::Value::Boolean(true)));
        assert_eq!(value_from_text("1GiB", None, false), Ok(toml::Value::String("1GiB".into())));
        assert_eq!(value_from_text("7", None, true), Ok(toml::Value::String("7".into())));
        let list = toml::Value::Array(vec![]);
        assert!(value_from_text("1", Some(&list), false).unwrap_err().contains("cannot be swept"));
    }
}
