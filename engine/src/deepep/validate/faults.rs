//! `[[fault]]` entries (docs/scenario.md, "Faults"): each kind's keys present and no other,
//! ranks, nodes and NICs that exist, finite values in their ranges; then the typed faults.

use crate::diag::Diagnostics;
use crate::fault::{Delay, Fault, Faults, MAX_FAULT_TIME_US, MAX_STRAGGLER_DELAY_US};
use crate::ids::Rank;
use crate::plan::{JobKind, JobPlan};
use crate::profile::HardwareProfile;
use crate::scenario::schema::{DelayDist, FaultKind, FaultSpec, Scenario};
use crate::scenario::schema::{FabricRouting, NvlinkKind};
use crate::topology::Topology;

/// The keys each kind takes besides `kind` (the first group: all required; `delay_us` and
/// `delay` are alternatives; `duration_us` is optional).
fn keys_of(kind: FaultKind) -> &'static [&'static str] {
    match kind {
        FaultKind::Straggler => &["ranks", "delay_us", "delay"],
        FaultKind::RankDown => &["ranks", "at_us"],
        FaultKind::NicDown => &["node", "nic", "at_us", "duration_us"],
        FaultKind::PacketLoss => &["rate"],
        FaultKind::NvlinkDegraded => &["node", "fraction"],
    }
}

/// The keys an entry sets.
fn keys_set(f: &FaultSpec) -> Vec<&'static str> {
    let present = [
        ("ranks", f.ranks.is_some()),
        ("delay_us", f.delay_us.is_some()),
        ("delay", f.delay.is_some()),
        ("at_us", f.at_us.is_some()),
        ("node", f.node.is_some()),
        ("nic", f.nic.is_some()),
        ("duration_us", f.duration_us.is_some()),
        ("rate", f.rate.is_some()),
        ("fraction", f.fraction.is_some()),
    ];
    present.into_iter().filter(|(_, set)| *set).map(|(k, _)| k).collect()
}

struct Ctx<'a, 'd> {
    d: &'a mut Diagnostics<'d>,
    prefix: String,
}

impl Ctx<'_, '_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.prefix)
    }

    fn error(&mut self, rule: &str, k: &str, message: String) {
        let key = self.key(k);
        self.d.error(rule, &key, None, message);
    }

    /// A finite number in `[lo, hi]` (`lo_open`: `(lo, hi]`), or `None` (reported).
    fn number(&mut self, k: &str, v: f64, lo: f64, lo_open: bool, hi: f64) -> Option<f64> {
        let low_ok = if lo_open { v > lo } else { v >= lo };
        if v.is_finite() && low_ok && v <= hi {
            return Some(v);
        }
        let open = if lo_open { "(" } else { "[" };
        self.error("fault-range", k, format!("{v}: expected a finite number in {open}{lo}, {hi}]"));
        None
    }

    /// A required key is missing (located at its entry).
    fn missing(&mut self, kind: FaultKind, k: &str, what: &str) {
        self.error("fault-key", k, format!("kind = \"{}\" needs {what}", kind.as_str()));
    }
}

fn us_to_ns(us: f64) -> u64 {
    (us * 1e3).round() as u64
}

/// Check every `[[fault]]` and resolve them; `None` when any is wrong (reported).
pub(super) fn check(
    scn: &Scenario,
    profile: &HardwareProfile,
    topo: &Topology,
    jobs: &[Option<JobPlan>],
    d: &mut Diagnostics<'_>,
) -> Option<Faults> {
    let before = d.items.len();
    let mut items = Vec::new();
    let mut loss_at: Option<usize> = None;
    for (i, f) in scn.faults.iter().enumerate() {
        let mut c = Ctx { d: &mut *d, prefix: format!("fault[{i}]") };
        let allowed = keys_of(f.kind);
        for k in keys_set(f).into_iter().filter(|k| !allowed.contains(k)) {
            c.error(
                "fault-key",
                k,
                format!(
                    "kind = \"{}\" does not take {k} (it takes {})",
                    f.kind.as_str(),
                    allowed.join(", ")
                ),
            );
        }
        let fault = match f.kind {
            FaultKind::Straggler => straggler(&mut c, f, topo, jobs),
            FaultKind::RankDown => rank_down(&mut c, f, topo, jobs),
            FaultKind::NicDown => {
                refuse_adaptive(&mut c, f.kind, profile);
                nic_down(&mut c, f, profile, topo)
            }
            FaultKind::PacketLoss => {
                if let Some(first) = loss_at.replace(i) {
                    c.error(
                        "fault-duplicate",
                        "kind",
                        format!("fault[{first}] already sets the fabric's packet loss"),
                    );
                }
                packet_loss(&mut c, f, profile)
            }
            FaultKind::NvlinkDegraded => nvlink_degraded(&mut c, f, topo, &items),
        };
        items.extend(fault);
    }
    let enable_shrink_advice = jobs.iter().flatten().filter_map(|j| {
        let d = j.deepep()?;
        (d.buffer.enable_shrink && d.mode != crate::deepep::config::EpMode::LowLatency).then_some(j)
    });
    for j in enable_shrink_advice {
        d.advisory(
            "shrink-ll-only",
            &format!("job[{}].buffer.enable_shrink", j.id.0),
            Some(&j.name),
            "enable_shrink masks failed ranks in the low-latency kernels only (DeepEP §3, §13): \
             this job's normal kernels still trap on a timeout"
                .into(),
        );
    }
    let errors = d.items[before..].iter().any(|x| x.is_error());
    let seed = jobs.iter().flatten().find_map(|j| j.deepep()).map_or(1, |d| d.workload.seed);
    (!errors).then_some(Faults { items, seed })
}

/// Sorted global ranks of a `ranks` key, each in some job (`deepep_only`: a DeepEP job).
fn ranks_of(
    c: &mut Ctx<'_, '_>,
    f: &FaultSpec,
    topo: &Topology,
    jobs: &[Option<JobPlan>],
    deepep_only: bool,
) -> Option<Vec<Rank>> {
    let Some(set) = &f.ranks else {
        c.missing(f.kind, "ranks", "ranks");
        return None;
    };
    let ranks = match set.resolve(topo.num_ranks()) {
        Ok(r) => r,
        Err(message) => {
            c.error("fault-ranks", "ranks", message);
            return None;
        }
    };
    for &r in &ranks {
        let job = jobs.iter().flatten().find(|j| j.ranks.binary_search(&Rank(r)).is_ok());
        let ok = match job {
            None => false,
            Some(j) => !deepep_only || matches!(j.kind, JobKind::DeepEp(_)),
        };
        if !ok {
            let what = if deepep_only { "a DeepEP job" } else { "a job" };
            c.error("fault-ranks", "ranks", format!("rank {r} is in no {what}"));
            return None;
        }
    }
    Some(ranks.into_iter().map(Rank).collect())
}

fn straggler(
    c: &mut Ctx<'_, '_>,
    f: &FaultSpec,
    topo: &Topology,
    jobs: &[Option<JobPlan>],
) -> Option<Fault> {
    let ranks = ranks_of(c, f, topo, jobs, false);
    let max = MAX_STRAGGLER_DELAY_US;
    let delay = match (f.delay_us, f.delay) {
        (Some(_), Some(_)) => {
            c.error("fault-key", "delay", "give delay_us or delay, not both".into());
            None
        }
        (None, None) => {
            c.missing(
                f.kind,
                "delay_us",
                "delay_us (or delay = { dist = \"normal\", mean_us, sd_us })",
            );
            None
        }
        (Some(us), None) => {
            c.number("delay_us", us, 0.0, false, max).map(|us| Delay::Fixed { ns: us_to_ns(us) })
        }
        (None, Some(spec)) => {
            let DelayDist::Normal = spec.dist;
            let mean = c.number("delay.mean_us", spec.mean_us, 0.0, false, max);
            let sd = c.number("delay.sd_us", spec.sd_us, 0.0, false, max);
            Some(Delay::Normal { mean_ns: mean? * 1e3, sd_ns: sd? * 1e3 })
        }
    };
    Some(Fault::Straggler { ranks: ranks?, delay: delay? })
}

fn rank_down(
    c: &mut Ctx<'_, '_>,
    f: &FaultSpec,
    topo: &Topology,
    jobs: &[Option<JobPlan>],
) -> Option<Fault> {
    let ranks = ranks_of(c, f, topo, jobs, true);
    let at = match f.at_us {
        Some(us) => c.number("at_us", us, 0.0, false, MAX_FAULT_TIME_US),
        None => {
            c.missing(f.kind, "at_us", "at_us");
            None
        }
    };
    Some(Fault::RankDown { ranks: ranks?, at_ns: us_to_ns(at?) })
}

fn node_of(c: &mut Ctx<'_, '_>, f: &FaultSpec, topo: &Topology) -> Option<u32> {
    let Some(node) = f.node else {
        c.missing(f.kind, "node", "node");
        return None;
    };
    if node >= topo.nodes {
        c.error(
            "fault-node",
            "node",
            format!("node {node} does not exist: the cluster has {} node(s)", topo.nodes),
        );
        return None;
    }
    Some(node)
}

fn nic_down(
    c: &mut Ctx<'_, '_>,
    f: &FaultSpec,
    profile: &HardwareProfile,
    topo: &Topology,
) -> Option<Fault> {
    let node = node_of(c, f, topo);
    let nics_per_node = topo.gpus_per_node * profile.nic.per_gpu.max(1);
    let nic = match f.nic {
        None => {
            c.missing(f.kind, "nic", "nic");
            None
        }
        Some(n) if n >= nics_per_node => {
            c.error(
                "fault-nic",
                "nic",
                format!(
                    "NIC {n} does not exist: a node has {nics_per_node} NIC(s) ({} GPUs × {} per GPU)",
                    topo.gpus_per_node,
                    profile.nic.per_gpu.max(1)
                ),
            );
            None
        }
        Some(n) => Some(n),
    };
    if let Some(n) = nic.filter(|&n| n >= topo.gpus_per_node) {
        let key = c.key("nic");
        c.d.advisory(
            "fault-nic-unused",
            &key,
            None,
            format!(
                "NIC {n} is not a GPU's first NIC: DeepEP addresses only the first NIC of each \
                 GPU (DeepEP §12), so nothing uses it"
            ),
        );
    }
    let at = match f.at_us {
        Some(us) => c.number("at_us", us, 0.0, false, MAX_FAULT_TIME_US),
        None => {
            c.missing(f.kind, "at_us", "at_us");
            None
        }
    };
    let duration = match f.duration_us {
        Some(us) => Some(c.number("duration_us", us, 0.0, true, MAX_FAULT_TIME_US).map(us_to_ns)),
        None => Some(None),
    };
    Some(Fault::NicDown { node: node?, nic: nic?, at_ns: us_to_ns(at?), duration_ns: duration? })
}

fn packet_loss(c: &mut Ctx<'_, '_>, f: &FaultSpec, profile: &HardwareProfile) -> Option<Fault> {
    let Some(rate) = f.rate else {
        c.missing(f.kind, "rate", "rate");
        return None;
    };
    let ok = rate.is_finite() && (0.0..1.0).contains(&rate);
    if !ok {
        c.error("fault-range", "rate", format!("{rate}: a drop probability in [0, 1)"));
        return None;
    }
    if refuse_adaptive(c, f.kind, profile) {
        return None;
    }
    Some(Fault::PacketLoss { rate })
}

/// Lost packets under adaptive routing are not modelled: the model's go-back-N receiver takes
/// a QP's packets in order, and adaptive routing reorders them (docs/design.md, faults §3).
/// `true` when refused (reported).
fn refuse_adaptive(c: &mut Ctx<'_, '_>, kind: FaultKind, profile: &HardwareProfile) -> bool {
    if profile.fabric.routing != FabricRouting::Adaptive {
        return false;
    }
    c.error(
        "fault-loss-adaptive",
        "kind",
        format!(
            "{} with routing = \"adaptive\" is not modelled: the go-back-N receiver needs a \
             QP's packets in order, and adaptive routing reorders them",
            kind.as_str()
        ),
    );
    true
}

fn nvlink_degraded(
    c: &mut Ctx<'_, '_>,
    f: &FaultSpec,
    topo: &Topology,
    earlier: &[Fault],
) -> Option<Fault> {
    let node = node_of(c, f, topo);
    let fraction = match f.fraction {
        Some(x) => c.number("fraction", x, 0.0, true, 1.0),
        None => {
            c.missing(f.kind, "fraction", "fraction");
            None
        }
    };
    let node = node?;
    if earlier.iter().any(|e| matches!(e, Fault::NvlinkDegraded { node: n, .. } if *n == node)) {
        c.error(
            "fault-duplicate",
            "node",
            format!("an earlier nvlink_degraded fault already degrades node {node}"),
        );
        return None;
    }
    if topo.nvlink == NvlinkKind::None {
        let key = c.key("node");
        c.d.advisory(
            "fault-no-nvlink",
            &key,
            None,
            "the cluster has no NVLink (nvlink = \"none\"): nothing to degrade".into(),
        );
    }
    Some(Fault::NvlinkDegraded { node, fraction: fraction? })
}

#[cfg(test)]
mod tests;
