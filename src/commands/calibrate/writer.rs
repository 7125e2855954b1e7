//! The profile `eptwin calibrate` writes: the base profile's keys with what was measured here in
//! place of theirs, every value with its source in a comment — the probe (or fit) and the
//! machine it ran on for a measured value, the base file's own comment for one taken over.

use std::collections::BTreeMap;

use anyhow::{Result, bail};

/// The sections of a profile in the order they are written.
const SECTIONS: &[&str] =
    &["cluster", "gpu", "gpu.memory", "nvlink", "pcie", "nic", "fabric", "deepep"];

/// One value measured here: `section` as written in a profile (`gpu`, `gpu.memory`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub section: String,
    pub key: String,
    pub value: toml::Value,
    /// What it was derived from (`probe.memcpy_dtod_bw_gbps: 1 GiB cuMemcpy`).
    pub source: String,
}

impl Measured {
    pub fn new(section: &str, key: &str, value: impl Into<toml::Value>, source: String) -> Self {
        Measured { section: section.into(), key: key.into(), value: value.into(), source }
    }

    /// `section.key`.
    pub fn path(&self) -> String {
        format!("{}.{}", self.section, self.key)
    }
}

/// The machine and the day every measured value of one run shares.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Machine {
    pub gpu: String,
    pub driver: String,
    /// `YYYY-MM-DD`.
    pub date: String,
}

impl Machine {
    fn label(&self) -> String {
        format!("{}, driver {}, {}", self.gpu, self.driver, self.date)
    }
}

/// A profile's text split into its values' comments: (section, key) → the comment after the
/// value, or the comment lines right above it.
fn comments(text: &str) -> BTreeMap<(String, String), String> {
    let mut out = BTreeMap::new();
    let mut section = String::new();
    let mut above: Vec<String> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix('[') {
            section = rest.trim_end_matches(']').trim().to_string();
            above.clear();
            continue;
        }
        if let Some(c) = t.strip_prefix('#') {
            above.push(c.trim().to_string());
            continue;
        }
        let Some((key, rest)) = t.split_once('=') else {
            above.clear();
            continue;
        };
        let comment = match rest.split_once(" #") {
            Some((_, c)) => c.trim().to_string(),
            None => above.join(" "),
        };
        out.insert((section.clone(), key.trim().to_string()), comment);
        above.clear();
    }
    out
}

/// The profile's table at `section` (`gpu.memory` is `gpu`'s `memory` table).
fn section_of<'a>(table: &'a toml::Table, section: &str) -> Option<&'a toml::Table> {
    let mut t = table;
    for part in section.split('.') {
        t = t.get(part)?.as_table()?;
    }
    Some(t)
}

/// A value as written on a line of its own (`memory` and other tables are sections, not lines).
fn inline(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::Table(_) => None,
        v => Some(v.to_string()),
    }
}

/// The profile a calibrated one starts from: its name as written in comments, its file's text
/// (for the comments), its table.
#[derive(Debug, Clone)]
pub struct Base {
    pub label: String,
    pub text: String,
    pub table: toml::Table,
}

impl Base {
    /// The number at `[table] key` of the base profile (an integer or a float).
    pub fn number(&self, table: &str, key: &str) -> Option<f64> {
        let v = self.table.get(table)?.get(key)?;
        v.as_float().or_else(|| v.as_integer().map(|i| i as f64))
    }
}

/// The written profile's own lines: `name`, `description`, the leading comment's lines.
#[derive(Debug, Clone)]
pub struct Head {
    pub name: String,
    pub description: String,
    pub header: Vec<String>,
}

/// Render the profile: the base's keys (with their comments), `measured` in their place or
/// added, every measured value labelled with `machine`.
pub fn render(
    head: &Head,
    base: &Base,
    measured: &[Measured],
    machine: &Machine,
) -> Result<String> {
    let (name, description, header) = (&head.name, &head.description, &head.header);
    let (base_name, base) = (base.label.as_str(), (&base.text, &base.table));
    let base_comments = comments(base.0);
    let base = base.1;
    let mut by_section: BTreeMap<&str, Vec<&Measured>> = BTreeMap::new();
    for m in measured {
        let Some(section) = SECTIONS.iter().find(|s| **s == m.section) else {
            bail!("{}: not a profile section", m.path());
        };
        by_section.entry(section).or_default().push(m);
    }
    let mut out = String::new();
    for line in header {
        out.push_str(&format!("# {line}\n").replace("#  \n", "#\n"));
    }
    out.push_str(&format!("name = {}\n", toml::Value::from(name.as_str())));
    out.push_str(&format!("description = {}\n", toml::Value::from(description.as_str())));
    for section in SECTIONS {
        let from_base = section_of(base, section);
        let here = by_section.get(section).map(Vec::as_slice).unwrap_or(&[]);
        if from_base.is_none() && here.is_empty() {
            continue;
        }
        out.push_str(&format!("\n[{section}]\n"));
        let mut written: Vec<&str> = Vec::new();
        // The base's keys in its order, each measured one in its place.
        for (key, value) in from_base.into_iter().flatten() {
            if let Some(m) = here.iter().find(|m| m.key == *key) {
                out.push_str(&measured_line(m, machine));
                written.push(key);
                continue;
            }
            let Some(text) = inline(value) else { continue };
            // A base written by this command names its own base already ("from h100-cx7:
            // ..."); the same name is said once when a bundled profile is re-generated from
            // itself.
            let comment = base_comments
                .get(&(section.to_string(), key.clone()))
                .map(|c| own_comment(c, base_name))
                .filter(|c| !c.is_empty())
                .map_or_else(String::new, |c| format!(": {c}"));
            out.push_str(&format!("{key} = {text} # from {base_name}{comment}\n"));
            written.push(key);
        }
        for m in here.iter().filter(|m| !written.contains(&m.key.as_str())) {
            out.push_str(&measured_line(m, machine));
        }
    }
    Ok(out)
}

/// A base key's comment without the `from <base>` this command wrote on it before.
fn own_comment<'a>(comment: &'a str, base_name: &str) -> &'a str {
    let Some(rest) = comment.strip_prefix("from ").and_then(|c| c.strip_prefix(base_name)) else {
        return comment;
    };
    match rest.strip_prefix(": ") {
        Some(own) => own,
        None if rest.is_empty() => rest,
        None => comment,
    }
}

fn measured_line(m: &Measured, machine: &Machine) -> String {
    let text = inline(&m.value).unwrap_or_else(|| m.value.to_string());
    format!("{} = {text} # measured ({}): {}\n", m.key, machine.label(), m.source)
}

#[cfg(test)]
mod tests {
    use eptwin_engine::profile::{BUNDLED, HardwareProfile, bundled_table, check_text};

    use super::*;

    #[test]
    fn a_base_comment_names_its_base_once() {
        assert_eq!(own_comment("from h100-cx7: HGX baseboard", "h100-cx7"), "HGX baseboard");
        assert_eq!(own_comment("from h100-cx7", "h100-cx7"), "");
        assert_eq!(own_comment("from h100-cx7x: a", "h100-cx7"), "from h100-cx7x: a");
        assert_eq!(own_comment("from h200-single: a", "h100-cx7"), "from h200-single: a");
        assert_eq!(own_comment("HGX baseboard", "h100-cx7"), "HGX baseboard");
    }

    fn head(name: &str, description: &str, header: &[&str]) -> Head {
        Head {
            name: name.into(),
            description: description.into(),
            header: header.iter().map(|h| h.to_string()).collect(),
        }
    }

    fn based(label: &str, text: &str, table: toml::Table) -> Base {
        Base { label: label.into(), text: text.into(), table }
    }

    fn machine() -> Machine {
        Machine {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            driver: "580.159.04".into(),
            date: "2026-12-08".into(),
        }
    }

    #[test]
    fn a_measured_value_replaces_the_base_and_says_where_it_comes_from() {
        let text = BUNDLED.iter().find(|(n, _)| *n == "h100-cx7").unwrap().1;
        let base = bundled_table("h100-cx7").unwrap();
        let measured = [
            Measured::new("gpu", "memcpy_bw_gbps", 1502.2, "probe.memcpy_dtod_bw_gbps".into()),
            Measured::new("pcie", "bw_gbps", 55.5, "probe.pcie_bw_gbps".into()),
        ];
        let out = render(
            &head("my-h100", "an H100", &["written by eptwin calibrate"]),
            &based("h100-cx7", text, base),
            &measured,
            &machine(),
        )
        .unwrap();
        assert!(out.starts_with("# written by eptwin calibrate\nname = \"my-h100\"\n"), "{out}");
        assert!(out.contains(
            "memcpy_bw_gbps = 1502.2 # measured (NVIDIA H100 80GB HBM3, driver 580.159.04, 2026-12-08): probe.memcpy_dtod_bw_gbps\n"
        ));
        assert!(out.contains("[pcie]\nbw_gbps = 55.5 # measured"), "{out}");
        // A base value keeps its own source after the base's name, said once where the base
        // was itself written by calibrate from a base of that name.
        assert!(out.contains("gpus_per_node = 8 # from h100-cx7: HGX baseboard;"), "{out}");
        assert!(!out.contains("from h100-cx7: from h100-cx7"), "{out}");
        // The result is a profile: every key, every comment, every range.
        let table = check_text("my-h100.toml", &out).unwrap_or_else(|e| panic!("{e:?}\n{out}"));
        let p: HardwareProfile = table.try_into().unwrap();
        assert_eq!(p.name, "my-h100");
        assert_eq!(p.gpu.memcpy_bw_gbps, 1502.2);
        // Every numeric line has a comment (the bundled profiles' rule).
        for line in out
            .lines()
            .skip_while(|l| !l.starts_with('['))
            .filter(|l| l.contains(" = ") && !l.starts_with('#'))
        {
            assert!(line.contains(" # "), "no source on {line:?}");
        }
    }

    #[test]
    fn every_bundled_profile_renders_back_to_itself() {
        for (name, text) in BUNDLED {
            let base = bundled_table(name).unwrap();
            let out =
                render(&head(name, "", &[]), &based(name, text, base.clone()), &[], &machine())
                    .unwrap();
            let back: toml::Table = toml::from_str(&out).unwrap();
            let want: HardwareProfile = base.clone().try_into().unwrap();
            let mut got: HardwareProfile = back.try_into().unwrap();
            got.description = want.description.clone();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn unknown_sections_are_refused() {
        let base = bundled_table("h100-cx7").unwrap();
        let m = [Measured::new("gpu.cache", "x", 1i64, "y".into())];
        let err = render(&head("p", "", &[]), &based("b", "", base), &m, &machine()).unwrap_err();
        assert_eq!(err.to_string(), "gpu.cache.x: not a profile section");
    }
}
