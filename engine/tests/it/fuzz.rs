//! The parser and validator never panic: random bytes, and random damage to real scenarios.

use eptwin_engine::deepep::validate::validate;
use eptwin_engine::parse;
use proptest::prelude::*;

use crate::scenario_files;

fn check_no_panic(text: &str) {
    if let Ok(loaded) = parse("fuzz.toml", text) {
        let _ = validate(&loaded.scenario, &loaded.source);
    }
}

#[derive(Debug, Clone)]
enum Damage {
    DeleteLine(usize),
    DuplicateLine(usize),
    Truncate(usize),
    ReplaceByte(usize, u8),
    SwapNumber(usize, i64),
}

fn apply(text: &str, damage: &Damage) -> String {
    let lines: Vec<&str> = text.lines().collect();
    match *damage {
        Damage::DeleteLine(i) if !lines.is_empty() => {
            let i = i % lines.len();
            lines
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, l)| *l)
                .collect::<Vec<_>>()
                .join("\n")
        }
        Damage::DuplicateLine(i) if !lines.is_empty() => {
            let i = i % lines.len();
            let mut out: Vec<&str> = lines.clone();
            out.insert(i, lines[i]);
            out.join("\n")
        }
        Damage::Truncate(n) => text.chars().take(n % (text.len() + 1)).collect(),
        Damage::ReplaceByte(i, b) if !text.is_empty() => {
            let mut bytes = text.as_bytes().to_vec();
            let len = bytes.len();
            bytes[i % len] = b;
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Damage::SwapNumber(i, v) => {
            // Replace the i-th integer literal with v (negative, zero, huge).
            let mut count = 0;
            let mut out = String::new();
            for line in &lines {
                if let Some((k, val)) = line.split_once('=')
                    && val.trim().parse::<i64>().is_ok()
                {
                    if count == i % 64 {
                        out.push_str(&format!("{k}= {v}\n"));
                        count += 1;
                        continue;
                    }
                    count += 1;
                }
                out.push_str(line);
                out.push('\n');
            }
            out
        }
        _ => text.to_string(),
    }
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        any::<usize>().prop_map(Damage::DeleteLine),
        any::<usize>().prop_map(Damage::DuplicateLine),
        any::<usize>().prop_map(Damage::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Damage::ReplaceByte(i, b)),
        (
            any::<usize>(),
            prop_oneof![
                Just(0i64),
                Just(-1),
                Just(1),
                Just(i64::MAX),
                Just(i64::MIN),
                any::<i64>()
            ]
        )
            .prop_map(|(i, v)| Damage::SwapNumber(i, v)),
    ]
}

proptest! {
    #![proptest_config(eptwin_engine::testing::proptest_config(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_no_panic(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn damaged_scenarios_never_panic(index in any::<usize>(), damages in prop::collection::vec(damage(), 1..4)) {
        let files = scenario_files();
        let mut text = std::fs::read_to_string(&files[index % files.len()]).unwrap();
        for d in &damages {
            text = apply(&text, d);
        }
        check_no_panic(&text);
    }
}
