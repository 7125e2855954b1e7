//! Schema errors in plain words. The TOML deserializer reports serde's wording (`invalid type:
//! string "many", expected u32`); a scenario's reader wants `expected an integer, found the
//! string "many"`. The key path comes from the caller (`SourceMap::path_at`).

/// Rewrite one deserializer message; `value` is the text of the span it points at.
pub fn describe(message: &str, value: &str) -> String {
    for (prefix, with_range) in [("invalid type: ", false), ("invalid value: ", true)] {
        if let Some((found, expected)) =
            message.strip_prefix(prefix).and_then(|rest| rest.rsplit_once(", expected "))
        {
            return format!(
                "expected {}, found {}",
                expected_type(expected, with_range),
                found_value(found, value)
            );
        }
    }
    if let Some((variant, expected)) =
        message.strip_prefix("unknown variant ").and_then(|rest| rest.split_once(", "))
    {
        return format!("expected {}, found {}", one_of(expected), quoted(variant));
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let accepted = match rest.split_once(", ") {
            Some((_, expected)) => format!("; this table takes {}", names(expected)),
            None => String::new(),
        };
        return format!(
            "unknown key {}{accepted}",
            quoted(rest.split(", ").next().unwrap_or(rest))
        );
    }
    if let Some(field) = message.strip_prefix("missing field ") {
        return format!("missing required key {}", quoted(field));
    }
    if message == "wanted string or table" {
        return format!("expected a name (a string), found {}", short(value));
    }
    message.to_string()
}

/// serde's `expected` text for the types the schema uses, in words.
fn expected_type(expected: &str, with_range: bool) -> String {
    let range = |lo: &str, hi: &str| {
        if with_range { format!("an integer from {lo} to {hi}") } else { "an integer".to_string() }
    };
    match expected {
        "u8" => range("0", "255"),
        "u16" => range("0", "65535"),
        "u32" => range("0", "4294967295"),
        "u64" | "usize" => range("0", "9223372036854775807"),
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a sequence" => "a list".into(),
        "a map" => "a table".into(),
        other if other.starts_with("struct ") => "a table".into(),
        other if other.starts_with("a sequence") => "a list".into(),
        other => other.to_string(),
    }
}

/// serde's `Unexpected` text (`string "x"`, `integer `3``, `sequence`) with the value as
/// written where that says more.
fn found_value(found: &str, value: &str) -> String {
    let ticked = |prefix: &str| found.strip_prefix(prefix).map(|v| v.trim_matches('`').to_string());
    if let Some(s) = found.strip_prefix("string ") {
        return format!("the string {}", truncate(s, 60));
    }
    if let Some(n) = ticked("integer ") {
        return format!("the integer {n}");
    }
    if let Some(f) = ticked("floating point ") {
        let written = value.trim();
        let shown = if written.is_empty() { f } else { written.to_string() };
        return format!("the number {}", truncate(&shown, 40));
    }
    if let Some(b) = ticked("boolean ") {
        return b;
    }
    match found {
        "sequence" => format!("a list {}", short(value)).trim_end().to_string(),
        "map" if value.trim_start().starts_with('{') => {
            format!("a table {}", short(value)).trim_end().to_string()
        }
        "map" if value.trim_start().starts_with(|c: char| c.is_ascii_digit()) => {
            format!("the date-time {}", short(value))
        }
        "map" => "a table".into(),
        other => other.to_string(),
    }
}

/// `` `a`, `b` `` or `` one of `a`, `b` `` or `` `a` or `b` `` as `one of "a", "b"`.
fn one_of(expected: &str) -> String {
    let list = expected.trim_start_matches("expected ").trim_start_matches("one of ");
    let items: Vec<String> =
        list.split([',', ' ']).filter(|s| s.starts_with('`')).map(quoted).collect();
    match items.len() {
        0 => expected.to_string(),
        1 => items[0].clone(),
        _ => format!("one of {}", items.join(", ")),
    }
}

fn names(expected: &str) -> String {
    let list = expected.trim_start_matches("expected ").trim_start_matches("one of ");
    let items: Vec<&str> = list
        .split([',', ' '])
        .filter(|s| s.starts_with('`'))
        .map(|s| s.trim_matches('`'))
        .collect();
    if items.is_empty() { expected.to_string() } else { items.join(", ") }
}

fn quoted(ticked: &str) -> String {
    format!("{:?}", ticked.trim().trim_matches('`'))
}

fn short(value: &str) -> String {
    truncate(value.trim(), 40)
}

fn truncate(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(max_chars).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn serde_wording_becomes_plain() {
        let cases = [
            (
                r#"invalid type: string "many", expected u32"#,
                r#""many""#,
                r#"expected an integer, found the string "many""#,
            ),
            (
                "invalid value: integer `-1`, expected u32",
                "-1",
                "expected an integer from 0 to 4294967295, found the integer -1",
            ),
            (
                "invalid type: floating point `NaN`, expected u32",
                "nan",
                "expected an integer, found the number nan",
            ),
            (
                "invalid type: sequence, expected u32",
                "[1]",
                "expected an integer, found a list [1]",
            ),
            (
                "invalid type: map, expected u32",
                "{a=1}",
                "expected an integer, found a table {a=1}",
            ),
            (
                "invalid type: map, expected u32",
                "1979-05-27",
                "expected an integer, found the date-time 1979-05-27",
            ),
            ("invalid type: boolean `true`, expected f64", "true", "expected a number, found true"),
            (
                "invalid type: integer `1`, expected a boolean",
                "1",
                "expected true or false, found the integer 1",
            ),
            (
                "invalid type: integer `3`, expected struct ClusterSpec",
                "3",
                "expected a table, found the integer 3",
            ),
            (
                r#"invalid type: string "a, expected b", expected u32"#,
                "",
                r#"expected an integer, found the string "a, expected b""#,
            ),
            (
                "unknown variant `zipff`, expected one of `uniform`, `node-limited`, `zipf`",
                "",
                r#"expected one of "uniform", "node-limited", "zipf", found "zipff""#,
            ),
            (
                "unknown variant `x`, expected `a` or `b`",
                "",
                r#"expected one of "a", "b", found "x""#,
            ),
            (
                "unknown field `tokens`, expected one of `tokens_per_rank`, `hidden`",
                "",
                r#"unknown key "tokens"; this table takes tokens_per_rank, hidden"#,
            ),
            ("missing field `hidden`", "", r#"missing required key "hidden""#),
            ("wanted string or table", "3", "expected a name (a string), found 3"),
            ("duplicate key", "", "duplicate key"),
        ];
        for (serde, value, plain) in cases {
            assert_eq!(describe(serde, value), plain, "{serde}");
        }
    }
}
