//! `eptwin topo`: the NVLink connectivity check on the declared topology (with a scenario) or
//! through NVML on a GPU machine.

use std::path::Path;

use anyhow::Result;
use eptwin_engine::api::GpuId;
use eptwin_engine::topology::{
    DeclaredProbe, NvlinkCheckMode, NvlinkReport, PAIR_LIST_GPUS, TopologyProbe,
    check_nvlink_connections,
};

use super::load_plan;
use crate::{ExitCode, outln};

pub fn topo(scenario: Option<&Path>, disable_nvlink: bool, hw: bool) -> Result<ExitCode> {
    let plan = match scenario {
        Some(path) => match load_plan(path) {
            Some(p) => Some(p),
            None => return Ok(ExitCode::BadInput),
        },
        None => None,
    };
    let bypass = disable_nvlink
        || plan.as_ref().is_some_and(|p| {
            p.jobs.iter().any(|j| j.env.get("DISABLE_NVLINK_CHECK").is_some_and(|v| v.value == "1"))
        });
    let probe: Box<dyn TopologyProbe> = match (&plan, hw) {
        (Some(p), false) => Box::new(DeclaredProbe {
            topology: p.topology.clone(),
            gpu_name: p.profile.gpu.name.clone(),
            label: format!("declared topology of {}", p.scenario_file),
        }),
        _ => match eptwin_hw::nvml_probe() {
            Ok(probe) => probe,
            Err(reason) => {
                outln!("# eptwin topo: Waived: {reason}");
                return Ok(ExitCode::Waived);
            }
        },
    };
    let count = probe.gpu_count().map_err(anyhow::Error::msg)?;
    let gpus: Vec<u32> = (0..count).collect();
    let domains: Vec<Option<u32>> = match &plan {
        Some(p) => gpus.iter().map(|&g| p.topology.nvlink_domain(GpuId(g))).collect(),
        // Without a scenario, strict mode expects one NVLink domain over all visible GPUs.
        None => vec![Some(0); gpus.len()],
    };
    let mut code = ExitCode::Ok;
    // DeepEP checks its own process group: per job with a scenario, all visible GPUs without.
    let mut groups: Vec<(String, Vec<u32>)> = match &plan {
        Some(p) => p
            .jobs
            .iter()
            .filter(|j| j.deepep().is_some())
            .map(|j| {
                let mut g: Vec<u32> = j.ranks.iter().map(|&r| p.topology.gpu_of(r).0).collect();
                g.dedup();
                (format!("job {:?}", j.name), g)
            })
            .collect(),
        None => Vec::new(),
    };
    if groups.is_empty() {
        groups.push(("all GPUs".into(), gpus.clone()));
    }
    let full =
        check_nvlink_connections(probe.as_ref(), &gpus, &domains, NvlinkCheckMode::Strict, bypass)
            .map_err(anyhow::Error::msg)?;
    print_matrix(&full);
    let mut reports = Vec::new();
    for (label, group) in &groups {
        let report =
            check_nvlink_connections(probe.as_ref(), group, &[], NvlinkCheckMode::DeepEp, bypass)
                .map_err(anyhow::Error::msg)?;
        reports.push((format!("DeepEP-compatible, {label}"), report));
    }
    reports.push(("strict, every pair within an NVLink domain".to_string(), full));
    for (label, report) in &reports {
        let verdict = if report.bypassed {
            "bypassed"
        } else if report.passed() {
            "passed"
        } else {
            "FAILED"
        };
        outln!("# check ({label}): {verdict}");
        for note in &report.notes {
            outln!("#   {note}");
        }
        for failure in &report.failures {
            outln!("#   FAILED: {failure}");
        }
        if !report.passed() {
            code = ExitCode::Failed;
        }
    }
    Ok(code)
}

fn print_matrix(report: &NvlinkReport) {
    outln!("# eptwin topo: {} ({} GPUs)", report.source, report.gpus.len());
    // Runs of consecutive GPUs with one name on one line: 16,384 GPUs are not 16,384 lines.
    let mut i = 0;
    while i < report.gpus.len() {
        let mut j = i;
        while j + 1 < report.gpus.len()
            && report.names[j + 1] == report.names[i]
            && report.gpus[j + 1] == report.gpus[j] + 1
        {
            j += 1;
        }
        if i == j {
            outln!("#   GPU{}: {}", report.gpus[i], report.names[i]);
        } else {
            outln!("#   GPU{}-GPU{}: {}", report.gpus[i], report.gpus[j], report.names[i]);
        }
        i = j + 1;
    }
    if report.gpus.len() > PAIR_LIST_GPUS {
        outln!(
            "#   {} of {} GPU pairs NVLink-connected (matrix omitted above {PAIR_LIST_GPUS} GPUs)",
            report.connected_pairs,
            report.total_pairs
        );
        return;
    }
    let mut header = String::from("        ");
    for g in &report.gpus {
        header.push_str(&format!("{:>6}", format!("GPU{g}")));
    }
    outln!("{header}");
    for &a in &report.gpus {
        let mut row = format!("{:>8}", format!("GPU{a}"));
        for &b in &report.gpus {
            let cell = if a == b {
                "X"
            } else {
                let (lo, hi) = (a.min(b), a.max(b));
                match report.pairs.iter().find(|p| p.a == lo && p.b == hi) {
                    Some(p) if p.nvlink => "NV",
                    _ => "-",
                }
            };
            row.push_str(&format!("{cell:>6}"));
        }
        outln!("{row}");
    }
}
