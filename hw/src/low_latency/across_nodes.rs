//! Low-latency jobs whose ranks span nodes: the wire (crate::internode::gpu) between the nodes,
//! and what the kernels need of it per rank (low_latency.cu sends a destination on another
//! node its messages through the send region and doorbells, in `LlLayout`).

use eptwin_engine::deepep::bytes::{ll_combine_msg_bytes, ll_dispatch_msg_bytes};
use eptwin_engine::routing::RoutingTable;
use eptwin_engine::scenario::schema::Dtype;

use crate::cuda::DeviceBuffer;
use crate::error::HwError;
use crate::exec::{Devices, dev_of};
use crate::internode::gpu::{AreaSizes, EndpointExchange, WireConfig, WireLinks, pinned};
use crate::internode::{Geometry, LlLayout, Traffic};

/// The wire of a low-latency job across nodes and its ranks' device state.
pub(super) struct LlAcross {
    /// Dropped first: the proxies and wire threads stop before any buffer they touch goes.
    pub(super) links: WireLinks,
    pub(super) geometry: Geometry,
    pub(super) layout: LlLayout,
    /// Per rank: the doorbell ticket and the remote counts seen (`[2][L][N]` u64).
    pub(super) tickets: Vec<DeviceBuffer>,
    pub(super) count_seen: Vec<DeviceBuffer>,
    /// Launches of dispatch and of combine so far (the cumulative counters' call index).
    pub(super) calls: [u32; 2],
    /// Wire bytes of one dispatch and one combine, all ranks.
    pub(super) rdma_bytes: [u64; 2],
}

/// Selections whose expert lives on another node than the token (each one message over the
/// wire per op).
pub(super) fn remote_selections(routing: &RoutingTable, g: &Geometry) -> u64 {
    let mut n = 0;
    for s in 0..routing.num_ranks {
        for t in 0..routing.tokens_per_rank {
            n += routing
                .experts(s, t)
                .iter()
                .filter(|&&e| e >= 0 && g.node_of(routing.rank_of_expert(e as u32)) != g.node_of(s))
                .count() as u64;
        }
    }
    n
}

impl LlAcross {
    pub(super) fn connect(
        devs: &mut Devices,
        gpu_of_rank: &[u32],
        routing: &RoutingTable,
        geometry: Geometry,
        config: &WireConfig,
        exchange: &dyn EndpointExchange,
    ) -> Result<LlAcross, HwError> {
        let layout = LlLayout::new(&geometry).map_err(|e| HwError::Unsupported(e.to_string()))?;
        let n = geometry.num_ranks;
        let mut nodes: Vec<u32> = (0..n).map(|r| geometry.node_of(r)).collect();
        nodes.dedup();
        let sizes = AreaSizes {
            recv_area_bytes: layout.recv_area_bytes,
            send_area_bytes: layout.send_area_bytes,
        };
        let links = WireLinks::connect(
            &pinned(&devs.list[0].gpu),
            &nodes,
            &geometry,
            Traffic::LowLatency,
            sizes,
            config,
            exchange,
        )?;
        let seen_words = 2 * geometry.num_local_experts() as usize * n as usize;
        let (mut tickets, mut count_seen) = (Vec::new(), Vec::new());
        for &gpu in gpu_of_rank.iter().take(n as usize) {
            let g = &dev_of(devs, gpu).gpu;
            let t = g.alloc(8)?;
            g.memset_u8(t.ptr, 0, t.bytes)?;
            let c = g.alloc(seen_words * 8)?;
            g.memset_u8(c.ptr, 0, c.bytes)?;
            tickets.push(t);
            count_seen.push(c);
        }
        let dtype = match geometry.dispatch_dtype {
            crate::internode::TokenDtype::Fp8 => Dtype::Fp8,
            crate::internode::TokenDtype::Bf16 => Dtype::Bf16,
        };
        let remote = remote_selections(routing, &geometry);
        let rdma_bytes = [
            remote * ll_dispatch_msg_bytes(geometry.hidden, dtype),
            remote * ll_combine_msg_bytes(geometry.hidden, Dtype::Bf16),
        ];
        Ok(LlAcross { links, geometry, layout, tickets, count_seen, calls: [0, 0], rdma_bytes })
    }
}
