//! Typed ids. A priority used as a QP index, or a VL used as an SL, is a classic simulator bug
//! (SimAI crashed indexing QPs by PFC priority); distinct types make the compiler catch it.

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            #[inline]
            pub const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(
    /// Global DeepEP rank (one process in the EP group).
    Rank(u32)
);
id_type!(
    /// Node index as DeepEP sees it (`rank / 8`): one NVSHMEM "RDMA rank" in normal mode.
    Node(u32)
);
id_type!(
    /// Physical GPU, global index over the cluster.
    GpuId(u32)
);
id_type!(
    /// Job index in the scenario (order of `[[job]]` tables).
    JobId(u32)
);
id_type!(
    /// Global expert index.
    ExpertId(u32)
);
id_type!(
    /// Queue-pair index within one (source rank, destination rank) connection.
    QpId(u32)
);
id_type!(
    /// InfiniBand service level, 0..=15 (or the Ethernet priority on RoCE).
    Sl(u8)
);
id_type!(
    /// Data virtual lane, 0..=14 (VL15 is management only).
    Vl(u8)
);
id_type!(
    /// A port of a switch or NIC in the fabric model.
    PortId(u32)
);
