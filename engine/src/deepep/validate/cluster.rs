//! Scenario-wide rules: the name, the hardware profile, the limits and ranges every later
//! rule computes with, the cluster's shape and the fabric's QoS tables.

use crate::diag::Diagnostics;
use crate::fabric::FabricQos;
use crate::profile::{self, HardwareProfile};
use crate::result::ProfileFileRecord;
use crate::scenario::schema::{NvlinkKind, Scenario};
use crate::topology::Topology;

pub(super) fn check_name(scn: &Scenario, d: &mut Diagnostics<'_>) {
    if scn.name.is_empty()
        || !scn.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        d.error(
            "name",
            "name",
            None,
            format!(
                "{:?}: a scenario name becomes a file name; use letters, digits, '-', '_', '.'",
                scn.name
            ),
        );
    }
}

/// The resolved hardware profile and the profile file it was read from (when the scenario
/// names a file), or `None` (reported) when it does not resolve.
pub(super) fn profile(
    scn: &Scenario,
    d: &mut Diagnostics<'_>,
) -> Option<(HardwareProfile, Option<ProfileFileRecord>)> {
    let mut record = None;
    let resolved = if profile::names_file(&scn.cluster.profile) {
        // A profile file (`eptwin calibrate` writes them), relative to the scenario.
        let path = profile::file_path(d.source().file(), &scn.cluster.profile);
        let shown = path.display().to_string();
        match profile::read_file(&d.source().on_disk(&path), &shown) {
            Ok((base, sha256)) => {
                record = Some(ProfileFileRecord { file: shown, sha256 });
                profile::resolve_with(&scn.cluster, base)
            }
            Err(faults) => {
                let message =
                    format!("the profile file does not hold a profile:\n  {}", faults.join("\n  "));
                d.error("profile", "cluster.profile", None, message);
                return None;
            }
        }
    } else {
        profile::resolve(&scn.cluster)
    };
    match resolved {
        Ok(p) => Some((p, record)),
        Err(e) => {
            d.error("profile", &e.key, None, e.message);
            None
        }
    }
}

/// The numeric limits of the scenario and the ranges of the resolved profile's keys
/// (docs/scenario.md, "Limits"); `false` (reported) when one is broken. Checked before every
/// other rule: those compute with these values.
pub(super) fn check_limits(
    scn: &Scenario,
    profile: &HardwareProfile,
    d: &mut Diagnostics<'_>,
) -> bool {
    let in_range = profile::ranges::check(profile, d);
    crate::scenario::limits::check(scn, profile, d) && in_range
}

pub(super) fn check_shape(t: &Topology, d: &mut Diagnostics<'_>) {
    for (value, key) in
        [(t.nodes, "nodes"), (t.gpus_per_node, "gpus_per_node"), (t.ranks_per_gpu, "ranks_per_gpu")]
    {
        if value == 0 {
            d.error(
                "cluster-shape",
                &format!("cluster.{key}"),
                None,
                format!("{key} = 0; must be at least 1"),
            );
        }
    }
    match t.nvlink {
        NvlinkKind::Mnnvl => {
            let dom = t.nvlink_domain_gpus;
            if dom == 0 || !dom.is_multiple_of(t.gpus_per_node.max(1)) {
                d.error(
                    "mnnvl-domain",
                    "cluster.nvlink_domain_gpus",
                    None,
                    format!("{dom} GPUs per MNNVL domain: must be a positive multiple of gpus_per_node = {}", t.gpus_per_node),
                );
            } else if !t.num_gpus().is_multiple_of(dom) {
                d.advisory(
                    "mnnvl-domain",
                    "cluster.nvlink_domain_gpus",
                    None,
                    format!("{} GPUs do not fill whole {dom}-GPU NVLink domains: the last domain is partial", t.num_gpus()),
                );
            }
        }
        NvlinkKind::PciePairs if !t.gpus_per_node.is_multiple_of(2) => d.error(
            "pcie-pairs",
            "cluster.gpus_per_node",
            None,
            format!(
                "nvlink = \"pcie-pairs\" bridges GPUs in pairs: gpus_per_node = {} must be even",
                t.gpus_per_node
            ),
        ),
        _ => {}
    }
}

/// The fabric's QoS tables; `None` (reported, pointing at the written key or at the profile)
/// when they break a rule.
pub(super) fn fabric_qos(
    scn: &Scenario,
    profile: &HardwareProfile,
    d: &mut Diagnostics<'_>,
) -> Option<FabricQos> {
    match FabricQos::from_params(&profile.fabric) {
        Ok(q) => Some(q),
        Err(errors) => {
            for (key, message) in errors {
                let base = key.split('[').next().unwrap_or(&key).to_string();
                let written = scn.cluster.fabric.is_some()
                    && d.source().has(&format!("cluster.fabric.{base}"));
                let path = if written {
                    format!("cluster.fabric.{key}")
                } else {
                    "cluster.profile".into()
                };
                d.error("fabric", &path, None, message);
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::profile::BUNDLED;
    use crate::testing::one_gpu_low_latency;

    /// A scenario in a temporary directory naming `profile` (written there as `p/mine.toml`).
    fn draft(dir: &std::path::Path, profile: &str) -> crate::testing::ScenarioDraft {
        std::fs::create_dir_all(dir.join("p")).unwrap();
        std::fs::write(dir.join("p/mine.toml"), profile).unwrap();
        one_gpu_low_latency("t")
            .named_file(&dir.join("t.toml").display().to_string())
            .set("cluster.profile", "p/mine.toml")
    }

    #[test]
    fn a_profile_file_next_to_the_scenario_is_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        let text = BUNDLED.iter().find(|(n, _)| *n == "h200-single").unwrap().1;
        let text = text.replacen("name = \"h200-single\"", "name = \"mine\"", 1);
        let plan = draft(dir.path(), &text).plan();
        assert_eq!(plan.profile.name, "mine");
        let record = plan.profile_file.clone().unwrap();
        assert_eq!(record.file, dir.path().join("p/mine.toml").display().to_string());
        assert_eq!(record.sha256, crate::scenario::sha256_hex(text.as_bytes()));
        // The inputs' digest covers the profile's bytes.
        assert_ne!(plan.inputs_sha256(), plan.scenario_sha256);
        // Overrides apply on a file as on a bundled profile.
        let plan = draft(dir.path(), &text).set("cluster.overrides.gpu.sm_count", 100).plan();
        assert_eq!(plan.profile.gpu.sm_count, 100);
    }

    #[test]
    fn a_fault_in_the_profile_file_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let text = BUNDLED.iter().find(|(n, _)| *n == "h200-single").unwrap().1;
        let bad = text.replacen("sm_count = 132", "sm_count = 0", 1);
        let line = bad.lines().position(|l| l.starts_with("sm_count = 0")).unwrap() + 1;
        let d = draft(dir.path(), &bad);
        let errors = d.errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        let shown = errors[0].to_string();
        let want = format!(
            "{}:{}:1: error[profile]: cluster.profile: the profile file does not hold a profile:\n  {}:{line}:",
            d.file(),
            d.line_of_key("profile"),
            dir.path().join("p/mine.toml").display()
        );
        assert!(shown.starts_with(&want), "{shown}\n{want}");
        assert!(shown.contains("gpu.sm_count = 0: expected"), "{shown}");
        // A missing file: its path.
        let missing = one_gpu_low_latency("t")
            .named_file(&dir.path().join("t.toml").display().to_string())
            .set("cluster.profile", "none.toml");
        let shown = missing.errors()[0].to_string();
        assert!(shown.contains(&dir.path().join("none.toml").display().to_string()), "{shown}");
    }
}
