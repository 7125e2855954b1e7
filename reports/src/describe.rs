//! Words for results: which backend, which hardware (legends and tables name both), and the
//! order names are listed in.

use eptwin_engine::api::RunResult;
use serde_json::Value;

/// How a hardware result's internode bytes moved (`backend.wire`: "verbs", "tcp", "none"),
/// when it says.
pub fn wire(result: &RunResult) -> Option<&str> {
    result.backend.get("wire").and_then(Value::as_str)
}

/// Why a measured result is not a measurement of any fabric, when it is not: its internode
/// bytes went over the TCP wire (`backend.wire = "tcp"`).
pub fn not_a_fabric_measurement(result: &RunResult) -> Option<String> {
    (wire(result) == Some("tcp")).then(|| {
        "wire: tcp — measured over the TCP wire (sockets between the nodes' processes), so its \
         times are TCP and PCIe times, not a fabric measurement; not compared with the simulator"
            .to_string()
    })
}

/// "simulator" or "measured" (or the kind string for anything else).
pub fn backend_word(result: &RunResult) -> &str {
    match result.backend_kind() {
        "sim" => "simulator",
        "hw" | "deepep" => "measured",
        other => other,
    }
}

fn fact<'a>(result: &'a RunResult, key: &str) -> Option<&'a str> {
    result.scenario.facts.get(key).and_then(Value::as_str)
}

/// The name of every GPU a measured result recorded: `backend.gpu_names` (a list; eptwin-hw
/// writes it, `eptwin deepep import --gpu` too), or `backend.gpus` as a list of names or of
/// objects with a `name`, or as the hardware backend's own summary string ("1 x NVIDIA
/// H200"), or `gpu` / `gpu_name` / `device`. Empty when it recorded none.
pub fn measured_gpu_names(result: &RunResult) -> Vec<String> {
    let b = &result.backend;
    let list = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|g| match g {
                        Value::String(s) => Some(s.clone()),
                        Value::Object(o) => {
                            o.get("name").and_then(Value::as_str).map(str::to_string)
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    match (b.get("gpu_names"), b.get("gpus")) {
        (Some(v @ Value::Array(_)), _) | (None, Some(v @ Value::Array(_))) => list(v),
        (_, Some(Value::String(summary))) => {
            let (count, name) = match summary.split_once(" x ") {
                Some((n, name)) => (n.trim().parse().unwrap_or(1), name.trim()),
                None => (1, summary.trim()),
            };
            vec![name.to_string(); count.clamp(1, 1024)]
        }
        _ => ["gpu", "gpu_name", "device"]
            .iter()
            .find_map(|k| b.get(*k).and_then(Value::as_str))
            .map(|s| vec![s.to_string()])
            .unwrap_or_default(),
    }
}

/// The GPUs a hardware result recorded, counted: "1× NVIDIA H200".
fn measured_gpus(result: &RunResult) -> Option<String> {
    let names = measured_gpu_names(result);
    let first = names.first()?;
    if names.iter().all(|n| n == first) {
        Some(format!("{}× {first}", names.len()))
    } else {
        Some(names.join(", "))
    }
}

/// Whether a GPU name as measured (NVML, CUDA: "NVIDIA H100 80GB HBM3") is the GPU `model`
/// names (a profile's `gpu.name`, or a name given with `--allow-other-gpu`): the same words,
/// case and an "NVIDIA" prefix aside, or the model's words followed by more (a memory or form
/// factor the model leaves open: "H100" is "H100 80GB HBM3"; "H100 80GB HBM3" is not
/// "H100 PCIe").
pub fn same_gpu(measured: &str, model: &str) -> bool {
    let words = |s: &str| -> Vec<String> {
        let w: Vec<String> = s.split_whitespace().map(str::to_lowercase).collect();
        match w.first().map(String::as_str) {
            Some("nvidia") => w[1..].to_vec(),
            _ => w,
        }
    };
    let (m, g) = (words(measured), words(model));
    !g.is_empty() && m.len() >= g.len() && m[..g.len()] == g[..]
}

/// The GPU model a simulator result modelled (its profile's `gpu.name`, `scenario.facts.gpu`).
pub fn modelled_gpu(result: &RunResult) -> Option<&str> {
    fact(result, "gpu")
}

/// The hardware behind a result: what was measured (GPU names) or what the simulator
/// modelled (the profile and its GPU).
pub fn hardware(result: &RunResult) -> String {
    let profile = fact(result, "profile");
    let gpu = fact(result, "gpu");
    match result.backend_kind() {
        "hw" => measured_gpus(result).or(gpu.map(str::to_string)).unwrap_or_else(|| "GPU".into()),
        // Imported from DeepEP's own test scripts: their logs name no GPU.
        "deepep" => {
            let script = match result.backend.get("script").and_then(Value::as_str) {
                Some(script) => format!("DeepEP {script}"),
                None => "DeepEP tests".into(),
            };
            match measured_gpus(result) {
                Some(gpus) => format!("{script} on {gpus}"),
                None => script,
            }
        }
        _ => match (gpu, profile) {
            (Some(g), Some(p)) => format!("{g} model, profile {p}"),
            (None, Some(p)) => format!("profile {p}"),
            (Some(g), None) => format!("{g} model"),
            (None, None) => "model".into(),
        },
    }
}

/// "simulator (NVIDIA H800 model, profile h800-cx7)" / "measured (1× NVIDIA H200)".
pub fn source_label(result: &RunResult) -> String {
    format!("{} ({})", backend_word(result), hardware(result))
}

/// The simulator's version and seed or the hardware's driver, for captions.
pub fn backend_detail(result: &RunResult) -> String {
    let b = &result.backend;
    let get = |k: &str| {
        b.get(k).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    };
    let mut parts = Vec::new();
    // Simulator: version and seed; hardware (eptwin-hw's identity keys): driver, CUDA, NCCL.
    for (key, word) in [
        ("version", "version"),
        ("seed", "seed"),
        ("driver_version", "driver"),
        ("cuda_version", "CUDA"),
        ("nccl_version", "NCCL"),
    ] {
        if let Some(v) = get(key) {
            parts.push(format!("{word} {v}"));
        }
    }
    parts.join(", ")
}

/// Sort key that orders `ep8` before `ep16` (digit runs compare as numbers).
pub fn natural_key(text: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        let digit = c.is_ascii_digit();
        let mut run = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_ascii_digit() != digit {
                break;
            }
            run.push(c);
            chars.next();
        }
        key.push(if digit { (run.parse().unwrap_or(u64::MAX), String::new()) } else { (0, run) });
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn result(kind: &str, backend: Value) -> RunResult {
        let mut r: RunResult = serde_json::from_value(serde_json::json!({
            "schema": 1,
            "scenario": {"name": "s", "sha256": "x",
                         "facts": {"profile": "h200-single", "gpu": "NVIDIA H200"}},
            "backend": {"kind": kind},
            "eptwin": {"version": "0.1.0", "git_commit": "abc"},
            "verdict": "ok",
            "jobs": []
        }))
        .unwrap();
        if let Value::Object(map) = backend {
            r.backend.extend(map.into_iter().collect::<BTreeMap<_, _>>());
        }
        r
    }

    #[test]
    fn gpus_are_told_apart_by_model() {
        assert!(same_gpu("NVIDIA H200", "NVIDIA H200"));
        assert!(same_gpu("NVIDIA H100 80GB HBM3", "NVIDIA H100"));
        assert!(same_gpu("nvidia h100 80gb hbm3", "H100 80GB HBM3"));
        assert!(!same_gpu("NVIDIA H100 80GB HBM3", "NVIDIA H200"));
        assert!(!same_gpu("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3"));
        assert!(!same_gpu("NVIDIA H20", "NVIDIA H200"));
        assert!(!same_gpu("NVIDIA H200", ""));
        let hw = result("hw", serde_json::json!({"gpus": "2 x NVIDIA H200"}));
        assert_eq!(measured_gpu_names(&hw), ["NVIDIA H200", "NVIDIA H200"]);
        assert_eq!(modelled_gpu(&hw), Some("NVIDIA H200"));
        assert!(measured_gpu_names(&result("deepep", serde_json::json!({}))).is_empty());
    }

    #[test]
    fn names_backend_and_hardware() {
        let sim = result("sim", serde_json::json!({"version": "0.1.0", "seed": 1}));
        assert_eq!(source_label(&sim), "simulator (NVIDIA H200 model, profile h200-single)");
        assert_eq!(backend_detail(&sim), "version 0.1.0, seed 1");
        let hw = result("hw", serde_json::json!({"gpus": [{"name": "NVIDIA H200", "uuid": "u"}]}));
        assert_eq!(source_label(&hw), "measured (1× NVIDIA H200)");
        let hw = result("hw", serde_json::json!({"gpus": ["A", "B"]}));
        assert_eq!(hardware(&hw), "A, B");
        let hw = result("hw", serde_json::json!({}));
        assert_eq!(hardware(&hw), "NVIDIA H200");
        // eptwin-hw's identity: a summary string and the list of names.
        let hw = result(
            "hw",
            serde_json::json!({"gpus": "1 x NVIDIA H200", "gpu_names": ["NVIDIA H200"],
                               "driver_version": "580.159.04", "cuda_version": "13.0"}),
        );
        assert_eq!(hardware(&hw), "1× NVIDIA H200");
        assert_eq!(backend_detail(&hw), "driver 580.159.04, CUDA 13.0");
        let hw = result("hw", serde_json::json!({"gpus": "1 x NVIDIA H200"}));
        assert_eq!(hardware(&hw), "1× NVIDIA H200");
        let deepep = result("deepep", serde_json::json!({"script": "test_low_latency.py"}));
        assert_eq!(source_label(&deepep), "measured (DeepEP test_low_latency.py)");
    }

    proptest::proptest! {
        #![proptest_config(eptwin_engine::testing::proptest_config(256))]
        /// Digit runs compare as numbers: `eN` sorts by N whatever the widths.
        #[test]
        fn natural_key_orders_numbers(a in 0u32..100_000, b in 0u32..100_000) {
            let (ka, kb) = (natural_key(&format!("ep{a}-ll")), natural_key(&format!("ep{b}-ll")));
            proptest::prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
        }
    }
}
