//! Low-latency jobs whose ranks span nodes: the wire (crate::internode::gpu) between the nodes,
//! and what the kernels need of it per rank (low_latency.cu sends a destination on another
//! node its messages through the send region and doorbells, in `LlLayout`).

use std::collections::BTreeMap;

use eptwin_engine::plan::{Dtype, RoutingTable, ll_combine_msg_bytes, ll_dispatch_msg_bytes};

use crate::cuda::DeviceBuffer;
use crate::error::HwError;
use crate::exec::{Devices, dev_of};
use crate::internode::gpu::{
    AreaSizes, EndpointExchange, WireConfig, WireLinks, owned_nodes, pinned,
};
use crate::internode::{Geometry, LlLayout, Traffic};

/// The wire of a low-latency job across nodes and its ranks' device state.
pub(super) struct LlAcross {
    /// Dropped first: the proxies and wire threads stop before any buffer they touch goes.
    /// Connected by `LlJob::connect` (collective with the other processes).
    pub(super) links: Option<WireLinks>,
    pub(super) geometry: Geometry,
    pub(super) layout: LlLayout,
    config: WireConfig,
    /// Per local rank: the doorbell ticket and the remote counts seen (`[2][L][N]` u64).
    pub(super) tickets: BTreeMap<u32, DeviceBuffer>,
    pub(super) count_seen: BTreeMap<u32, DeviceBuffer>,
    /// Launches of dispatch and of combine so far (the cumulative counters' call index).
    pub(super) calls: [u32; 2],
    /// Wire bytes of one dispatch and one combine sent by this process's ranks.
    pub(super) rdma_bytes: [u64; 2],
}

/// Selections whose expert lives on another node than the token (each one message over the
/// wire per op), of the (source rank, expert rank) pairs `counted` accepts.
pub(super) fn remote_selections(
    routing: &RoutingTable,
    g: &Geometry,
    counted: impl Fn(u32, u32) -> bool,
) -> u64 {
    let mut n = 0;
    for s in 0..routing.num_ranks {
        for t in 0..routing.tokens_per_rank {
            n += routing
                .experts(s, t)
                .iter()
                .filter(|&&e| e >= 0)
                .map(|&e| routing.rank_of_expert(e as u32))
                .filter(|&d| g.node_of(d) != g.node_of(s) && counted(s, d))
                .count() as u64;
        }
    }
    n
}

impl LlAcross {
    /// The per-rank device state of `local` ranks (whole nodes); the wire comes in
    /// [`LlAcross::connect_wire`].
    pub(super) fn prepare(
        devs: &mut Devices,
        gpu_of_rank: &[u32],
        routing: &RoutingTable,
        local: &[u32],
        geometry: Geometry,
        config: WireConfig,
    ) -> Result<LlAcross, HwError> {
        let layout = LlLayout::new(&geometry);
        owned_nodes(&geometry, local)?;
        let n = geometry.num_ranks;
        let seen_words = 2 * geometry.num_local_experts() as usize * n as usize;
        let (mut tickets, mut count_seen) = (BTreeMap::new(), BTreeMap::new());
        for &r in local {
            let g = &dev_of(devs, gpu_of_rank[r as usize]).gpu;
            let t = g.alloc(8)?;
            g.memset_u8(t.ptr, 0, t.bytes)?;
            let c = g.alloc(seen_words * 8)?;
            g.memset_u8(c.ptr, 0, c.bytes)?;
            tickets.insert(r, t);
            count_seen.insert(r, c);
        }
        let dtype = match geometry.dispatch_dtype {
            crate::internode::TokenDtype::Fp8 => Dtype::Fp8,
            crate::internode::TokenDtype::Bf16 => Dtype::Bf16,
        };
        // Dispatch messages leave their source's process, combine rows their expert's.
        let sent = remote_selections(routing, &geometry, |s, _| local.contains(&s));
        let returned = remote_selections(routing, &geometry, |_, d| local.contains(&d));
        let rdma_bytes = [
            sent * ll_dispatch_msg_bytes(geometry.hidden, dtype),
            returned * ll_combine_msg_bytes(geometry.hidden, Dtype::Bf16),
        ];
        Ok(LlAcross {
            links: None,
            geometry,
            layout,
            config,
            tickets,
            count_seen,
            calls: [0, 0],
            rdma_bytes,
        })
    }

    /// Regions, rings and proxies of the nodes this process runs, and the wire to the others.
    pub(super) fn connect_wire(
        &mut self,
        devs: &Devices,
        exchange: &mut dyn EndpointExchange,
    ) -> Result<(), HwError> {
        let local: Vec<u32> = self.tickets.keys().copied().collect();
        let owned = owned_nodes(&self.geometry, &local)?;
        let sizes = AreaSizes {
            recv_area_bytes: self.layout.recv_area_bytes,
            send_area_bytes: self.layout.send_area_bytes,
        };
        self.links = Some(WireLinks::connect(
            &pinned(&devs.list[0].gpu),
            &owned,
            &self.geometry,
            Traffic::LowLatency,
            sizes,
            &self.config,
            exchange,
        )?);
        Ok(())
    }

    pub(super) fn links(&self) -> &WireLinks {
        self.links.as_ref().expect("the wire is connected before any launch")
    }

    pub(super) fn links_mut(&mut self) -> &mut WireLinks {
        self.links.as_mut().expect("the wire is connected before any launch")
    }
}
