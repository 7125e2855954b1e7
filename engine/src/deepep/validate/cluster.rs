//! Scenario-wide rules: the name, the hardware profile, the cluster's shape and the fabric's
//! QoS tables.

use crate::diag::Diagnostics;
use crate::fabric::FabricQos;
use crate::profile::{self, HardwareProfile};
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

/// The resolved hardware profile, or `None` (reported) when it does not resolve.
pub(super) fn profile(scn: &Scenario, d: &mut Diagnostics<'_>) -> Option<HardwareProfile> {
    match profile::resolve(&scn.cluster) {
        Ok(p) => Some(p),
        Err(e) => {
            d.error("profile", &e.key, None, e.message);
            None
        }
    }
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
