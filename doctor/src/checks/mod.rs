//! The checks, in the order the report lists them (docs/doctor.md describes each: what it
//! reads, the issue it comes from, what it needs). Each takes the node's facts and, when a
//! scenario is given, what the scenario asks of the node, and returns one [`Finding`].

mod affinity;
mod gpu;
mod ibgda;
mod nic;
mod qp;
mod v2;
mod virt;

use crate::facts::Facts;
use crate::probe::Node;
use crate::report::{Finding, Status};
use crate::subject::Subject;

/// What every check sees.
pub struct Ctx<'a> {
    pub node: &'a Node,
    pub subject: Option<&'a Subject>,
    pub facts: &'a Facts,
}

impl Ctx<'_> {
    /// Whether RDMA matters: any job crosses nodes, or (without a scenario) the node has an
    /// RDMA device that a job could use.
    pub fn rdma_matters(&self) -> bool {
        match self.subject {
            Some(s) => s.needs_rdma(),
            None => !self.facts.nics.is_empty(),
        }
    }

    /// Whether V2 (NCCL GIN) matters: a V2 job, or no scenario and an RDMA device.
    pub fn v2_matters(&self) -> bool {
        match self.subject {
            Some(s) => s.any_v2() && s.needs_rdma(),
            None => !self.facts.nics.is_empty(),
        }
    }

    /// Whether NVSHMEM's IBGDA (V1) matters the same way.
    pub fn ibgda_matters(&self) -> bool {
        match self.subject {
            Some(s) => s.any_v1_nvshmem() && s.needs_rdma(),
            None => !self.facts.nics.is_empty(),
        }
    }

    /// Either DeepEP's GPU-initiated RDMA (V1 IBGDA or V2 GIN) matters.
    pub fn gpu_rdma_matters(&self) -> bool {
        self.ibgda_matters() || self.v2_matters()
    }
}

/// A finding for a check that does not apply or cannot run.
pub fn skip(check: &'static str, title: &'static str, why: impl Into<String>) -> Finding {
    Finding::new(check, title, Status::Skip, why)
}

/// Every check, in report order.
pub fn run_all(ctx: &Ctx<'_>) -> Vec<Finding> {
    let checks: [fn(&Ctx<'_>) -> Finding; 22] = [
        scenario,
        gpu::gpus,
        gpu::p2p,
        gpu::mnnvl,
        nic::devices,
        nic::ports,
        nic::roce_gid,
        nic::sl_tc,
        nic::rail_routes,
        affinity::nic_selection,
        affinity::pcie_links,
        ibgda::peer_memory,
        ibgda::peer_mapping,
        ibgda::uverbs,
        ibgda::container,
        ibgda::memlock,
        virt::sriov,
        virt::iommu,
        qp::budget,
        v2::gin_libmlx5,
        v2::nic_name,
        v2::pci_atomics,
    ];
    checks.iter().map(|check| check(ctx)).collect()
}

/// The validator's verdict on the scenario (errors stop the doctor before a plan exists; the
/// binary reports them): its advisories, each a DeepEP rule eptwin already knows.
fn scenario(ctx: &Ctx<'_>) -> Finding {
    const TITLE: &str = "Scenario rules (eptwin validate)";
    let Some(s) = ctx.subject else {
        return skip("scenario", TITLE, "no scenario given: node checks only");
    };
    let details: Vec<String> = s.advisories.iter().map(|d| d.to_string()).collect();
    let v2 = if s.any_v2() { "V2" } else { "V1" };
    Finding::new(
        "scenario",
        TITLE,
        Status::Ok,
        format!(
            "{} ({}): {} job(s), DeepEP {v2}, {} node(s) × {} GPUs; valid, {} advisory(ies)",
            s.name,
            s.file,
            s.jobs.len(),
            s.nodes,
            s.gpus_per_node,
            details.len()
        ),
    )
    .details(details)
}
