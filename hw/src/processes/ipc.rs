//! What processes share on the GPU: the buffers peers write into (CUDA IPC handles, as DeepEP
//! exchanges them) and the counter of the barrier before each timed launch.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Processes;
use crate::cuda::{DeviceBuffer, IpcExport, IpcMapping};
use crate::error::HwError;
use crate::exec::{Device, Devices, LaunchBarrier};
use crate::kernel_args;

/// How long the processes wait for each other while exchanging handles (every process has
/// finished its local setup by then).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(120);

/// Addresses of every rank's shared buffers as each of this process's GPUs sees them: this
/// process's own buffers as they are, other processes' mapped through IPC.
pub struct SharedBuffers {
    /// `[device index in Devices::list][job rank][buffer]`.
    per_device: Vec<Vec<Vec<u64>>>,
    _mappings: Vec<IpcMapping>,
}

impl SharedBuffers {
    /// Address of `rank`'s buffer number `buffer` on device `device` (index in the list).
    pub fn ptr(&self, device: usize, rank: u32, buffer: usize) -> u64 {
        self.per_device[device][rank as usize][buffer]
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct RankExports {
    rank: u32,
    buffers: Vec<IpcExport>,
}

/// Shares the buffers each local rank exports (`local`: job rank → its buffers, the same
/// count and order for every rank) with every process, and maps the other processes' ones
/// into each of this process's GPUs. One process: nothing is exchanged.
pub fn share_buffers(
    procs: Option<&mut Processes>,
    devs: &Devices,
    num_ranks: u32,
    local: &BTreeMap<u32, Vec<&DeviceBuffer>>,
    label: &str,
) -> Result<SharedBuffers, HwError> {
    let width = local.values().next().map_or(0, Vec::len);
    let mut table = vec![vec![0u64; width]; num_ranks as usize];
    for (&rank, bufs) in local {
        table[rank as usize] = bufs.iter().map(|b| b.ptr).collect();
    }
    let Some(procs) = procs else {
        return Ok(SharedBuffers {
            per_device: vec![table; devs.list.len()],
            _mappings: Vec::new(),
        });
    };
    let mut mine = Vec::new();
    for (&rank, bufs) in local {
        let dev = devs.list.iter().find(|d| d.ranks.contains(&rank)).expect("a local rank's GPU");
        let buffers = bufs.iter().map(|b| dev.gpu.ipc_export(b)).collect::<Result<_, _>>()?;
        mine.push(RankExports { rank, buffers });
    }
    let all: Vec<Vec<RankExports>> = procs.all_gather_json(label, &mine, EXCHANGE_TIMEOUT)?;
    let me = procs.rank();
    let mut per_device = Vec::with_capacity(devs.list.len());
    let mut mappings = Vec::new();
    for dev in &devs.list {
        let mut t = table.clone();
        for (p, exports) in all.iter().enumerate().filter(|(p, _)| *p != me) {
            for re in exports {
                if re.buffers.len() != width || re.rank >= num_ranks {
                    return Err(HwError::Setup {
                        context: format!("`{label}`"),
                        message: format!(
                            "process {p} shared {} buffers of rank {} ({width} expected, {num_ranks} ranks)",
                            re.buffers.len(),
                            re.rank
                        ),
                    });
                }
                for (i, export) in re.buffers.iter().enumerate() {
                    let mapping = dev.gpu.ipc_open(export)?;
                    t[re.rank as usize][i] = mapping.ptr;
                    mappings.push(mapping);
                }
            }
        }
        per_device.push(t);
    }
    Ok(SharedBuffers { per_device, _mappings: mappings })
}

/// The barrier every process's streams pass before a timed launch: a counter in process 0's
/// first GPU, mapped into every process, that each stream increments once per barrier
/// (`process_barrier` in kernels/cuda/sync.cu).
pub struct ProcessBarrier {
    /// The counter's address on each device of this process (index in `Devices::list`).
    counter: Vec<u64>,
    /// Streams that count in per barrier: every GPU of every process.
    participants: i32,
    epoch: i32,
    /// The first rank of this process (in the device's error record on a timeout).
    first_rank: i32,
    _owned: Option<DeviceBuffer>,
    _mappings: Vec<IpcMapping>,
}

impl ProcessBarrier {
    /// Process 0 allocates and zeroes the counter, every process maps it; collective.
    pub fn new(procs: &mut Processes, devs: &Devices, first_rank: u32) -> Result<Self, HwError> {
        let dev0 = &devs.list[0];
        let (owned, export) = if procs.rank() == 0 {
            let buf = dev0.gpu.alloc(128)?;
            dev0.gpu.memset_u8(buf.ptr, 0, buf.bytes)?;
            dev0.gpu.synchronize("zeroing the process barrier")?;
            let export = dev0.gpu.ipc_export(&buf)?;
            (Some(buf), Some(export))
        } else {
            (None, None)
        };
        let export: IpcExport =
            procs.broadcast_json("process barrier counter", export.as_ref(), EXCHANGE_TIMEOUT)?;
        let streams: Vec<u32> = procs.all_gather_json(
            "GPUs per process",
            &(devs.list.len() as u32),
            EXCHANGE_TIMEOUT,
        )?;
        let mut counter = Vec::new();
        let mut mappings = Vec::new();
        for dev in &devs.list {
            match &owned {
                // Process 0's own GPUs reach it directly (peer access among them).
                Some(buf) => counter.push(buf.ptr),
                None => {
                    let m = dev.gpu.ipc_open(&export)?;
                    counter.push(m.ptr);
                    mappings.push(m);
                }
            }
        }
        Ok(ProcessBarrier {
            counter,
            participants: streams.iter().sum::<u32>() as i32,
            epoch: 0,
            first_rank: first_rank as i32,
            _owned: owned,
            _mappings: mappings,
        })
    }
}

impl LaunchBarrier for ProcessBarrier {
    /// Queues the next barrier on every stream of this process (`list`: `Devices::list`).
    fn launch(&mut self, list: &[Device], timeout_ns: u64) -> Result<(), HwError> {
        self.epoch += 1;
        let target = self.epoch * self.participants;
        for (i, dev) in list.iter().enumerate() {
            let (counter, err, rank) = (self.counter[i], dev.err.ptr, self.first_rank);
            let mut a = kernel_args![counter, target, timeout_ns, err, rank];
            let f = dev.module("sync")?.function("process_barrier");
            // SAFETY: args match process_barrier(int*, int, u64, ErrorRecord*, int); the counter
            // is mapped in this context for the life of self.
            unsafe { dev.gpu.launch(f, 1, 32, &mut a)? };
        }
        Ok(())
    }
}
