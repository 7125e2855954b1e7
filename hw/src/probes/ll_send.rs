//! The low-latency kernels' send loop and the receive after it, step by step
//! (`probe.ll_send_chain`): what each step of `low_latency.cu`'s dispatch costs alone and under
//! full load, for the simulator's one-GPU low-latency model.

use std::collections::BTreeMap;

use super::{Buffers, time_us};
use crate::cuda::DeviceBuffer;
use crate::error::HwError;
use crate::exec::{Device, Devices};
use crate::kernel_args;
use crate::measurements::{LlChainShape, LlRecvShape, LlSendShape, Probes, round3};

/// Hidden size, BF16 row and FP8 message of the low-latency scenarios on one H200
/// (`scenarios/h200-ep8-ll-*.toml`: hidden 7168, FP8 dispatch with one scale per 128 channels;
/// hw/src/low_latency/mod.rs `msg_stride`).
const LL_HIDDEN: usize = 7168;
const LL_ROW_INT4: i32 = (LL_HIDDEN * 2 / 16) as i32;
const LL_MSG_INT4: i32 = ((16 + LL_HIDDEN + LL_HIDDEN / 128 * 4) / 16) as i32;
const LL_MSG_STRIDE: usize = (16 + LL_HIDDEN + LL_HIDDEN / 128 * 4).div_ceil(128) * 128;
/// EP8, top-8 of 256 experts: one slot counter per (source rank, expert).
const LL_RANKS: usize = 8;
const LL_TOPK: usize = 8;
const LL_EXPERTS: usize = 256;

/// The expert indices of `items` (token, rank) items, ranks interleaved as the kernel deals
/// them (item = token · 8 + rank): top-8 distinct experts, one from each group of 32, drawn
/// with a fixed LCG, as counter indices `rank · 256 + expert`.
fn ll_probe_topk(items: usize) -> Vec<i32> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut out = Vec::with_capacity(items * LL_TOPK);
    for it in 0..items {
        let rank = it % LL_RANKS;
        for k in 0..LL_TOPK {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let e = k * (LL_EXPERTS / LL_TOPK) + (state >> 33) as usize % (LL_EXPERTS / LL_TOPK);
            out.push((rank * LL_EXPERTS + e) as i32);
        }
    }
    out
}

/// The low-latency dispatch's send loop alone (`probe_ll_send`): per (token, rank) item the
/// FP8 cast from HBM, a named barrier, then 8 warps each load an expert index, take a slot with
/// a returning atomic, copy the 7,408-byte message from the staging buffer into the slot and
/// release-add a finish counter; optionally the count-signalling tail. One block alone and
/// every SM together (132 × 1,024 as the kernel runs), at the 128-token scenario's 1,024 items
/// and at 32 rounds per block, and with single steps left out to see what each costs under
/// load. Per shape: the launch (CUDA events, L2 flushed before), the send loop's span and
/// the tail's (%globaltimer), and one sending warp's time per round split into its steps.
pub(super) fn chain(devs: &mut Devices, b: &Buffers, p: &mut Probes) -> Result<(), HwError> {
    let (src, dst, big) = b.spans();
    let sms = devs.list[0].gpu.sm_count;
    let max_items = sms as usize * 32;
    let counters_n = (LL_RANKS * LL_EXPERTS) as i32;
    // Every item reads its own row and every message has its own slot (no index wraps).
    if max_items * LL_HIDDEN * 2 > big {
        return Err(HwError::Setup {
            context: "low-latency send chain probe".into(),
            message: format!("{max_items} rows of {} B do not fit {big} B", LL_HIDDEN * 2),
        });
    }
    let g = &devs.list[0].gpu;
    let bufs = ChainBuffers {
        staging: g.alloc(max_items * LL_MSG_STRIDE)?,
        topk: g.alloc(max_items * LL_TOPK * 4)?,
        ctrs: g.alloc(3 * counters_n as usize * 4)?,
        expect: g.alloc(counters_n as usize * 4)?,
        out: g.alloc((sms as usize * 9) * 8)?,
        topk_host: ll_probe_topk(max_items),
        slots_per_counter: (big / LL_MSG_STRIDE / counters_n as usize) as i32,
        src,
        dst,
    };
    g.upload(&bufs.topk, &bufs.topk_host)?;
    g.memset_u8(bufs.staging.ptr, 0, bufs.staging.bytes)?;
    // The full chain first: the variants without the cast copy the messages it staged.
    let full = format!("{sms}x1024");
    // (name, blocks, items, steps, then the receive loop on the messages just sent).
    let shapes: [(String, u32, usize, i32, bool); 7] = [
        ("1x1024".into(), 1, 64, SEND_ALL, false),
        (format!("{full}_1024items"), sms, 1024, SEND_ALL, true),
        (full.clone(), sms, max_items, SEND_ALL, true),
        (format!("{full}_no_atomic"), sms, max_items, SEND_ALL & !SEND_ATOMIC, false),
        (format!("{full}_no_release"), sms, max_items, SEND_ALL & !SEND_RELEASE, false),
        (format!("{full}_no_cast"), sms, max_items, SEND_ALL & !SEND_CAST, false),
        (format!("{full}_copy_only"), sms, max_items, 0, false),
    ];
    let mut res = BTreeMap::new();
    for (name, blocks, items, mode, with_recv) in shapes {
        let mut expect = vec![0i32; counters_n as usize];
        for &e in &bufs.topk_host[..items * LL_TOPK] {
            expect[e as usize] += 1;
        }
        let (shape, us) = send_shape(devs, &bufs, &expect, blocks, items, mode)?;
        res.insert(name.clone(), LlChainShape::Send(shape));
        if !with_recv {
            continue;
        }
        // The kernel's receive (every step), and at the low-latency 128-token item count the
        // same with steps left out, to tell what each step costs under full load.
        let variants: &[(&str, i32)] = if items == 1024 {
            &[
                ("", RECV_ALL),
                ("_no_discard", RECV_ALL & !RECV_DISCARD),
                ("_no_payload", RECV_ALL & !RECV_PAYLOAD),
                ("_no_scales", RECV_ALL & !RECV_SCALES),
                ("_header_only", RECV_HEADER),
                ("_polls_only", 0),
            ]
        } else {
            &[("", RECV_ALL)]
        };
        for &(suffix, steps) in variants {
            let r = ll_recv_after_send(
                devs,
                LlSendBufs {
                    x: src,
                    staging: bufs.staging.ptr,
                    recv: dst,
                    topk: bufs.topk.ptr,
                    ctrs: bufs.ctrs.ptr,
                },
                &expect,
                blocks,
                items,
                bufs.slots_per_counter,
                src + (256 << 20),
                big - (256 << 20),
                us,
                steps,
            )?;
            res.insert(format!("{name}_then_recv{suffix}"), LlChainShape::Recv(r));
        }
    }
    p.ll_send_chain = Some(res);
    Ok(())
}

/// The steps of the send loop (`LL_SEND_*` in kernels/cuda/probes.cu): the FP8 cast, the slot
/// atomic, the finish release, the count-signalling tail.
const SEND_CAST: i32 = 1;
const SEND_ATOMIC: i32 = 2;
const SEND_RELEASE: i32 = 4;
const SEND_TAIL: i32 = 8;
const SEND_ALL: i32 = SEND_CAST | SEND_ATOMIC | SEND_RELEASE | SEND_TAIL;

/// The send chain's buffers on the first GPU: staging, top-k rows, counters (slot, finish and
/// count flags), the expected counts and the per-block stamps; `src` holds the token rows and
/// `dst` the receive slots.
struct ChainBuffers {
    staging: DeviceBuffer,
    topk: DeviceBuffer,
    ctrs: DeviceBuffer,
    expect: DeviceBuffer,
    out: DeviceBuffer,
    topk_host: Vec<i32>,
    slots_per_counter: i32,
    src: u64,
    dst: u64,
}

/// One shape of the send loop: `blocks` blocks send `items` items running the steps `mode`.
/// Returns its figures and the launch's median time.
fn send_shape(
    devs: &mut Devices,
    b: &ChainBuffers,
    expect: &[i32],
    blocks: u32,
    items: usize,
    mode: i32,
) -> Result<(LlSendShape, f64), HwError> {
    let counters_n = (LL_RANKS * LL_EXPERTS) as i32;
    {
        let g = &devs.list[0].gpu;
        g.upload(&b.expect, expect)?;
        g.memset_u8(b.ctrs.ptr, 0, b.ctrs.bytes)?;
    }
    devs.clear_errors()?;
    let (x, st, rv, tk) = (b.src, b.staging.ptr, b.dst, b.topk.ptr);
    let (counters, finish, flags) =
        (b.ctrs.ptr, b.ctrs.ptr + counters_n as u64 * 4, b.ctrs.ptr + 2 * counters_n as u64 * 4);
    let (ex, o, err, to) = (b.expect.ptr, b.out.ptr, devs.list[0].err.ptr, devs.timeout_ns());
    let (row_int4, msg_int4, msg_bytes) = (LL_ROW_INT4, LL_MSG_INT4, LL_MSG_STRIDE as i32);
    let (topk_n, items_i, slots_per_counter) = (LL_TOPK as i32, items as i32, b.slots_per_counter);
    let mut launch_no = 0i32;
    let launch = |dev: &Device| {
        let f = dev.module("probes")?.function("probe_ll_send");
        launch_no += 1;
        let mut a = kernel_args![
            x,
            st,
            rv,
            tk,
            counters,
            finish,
            flags,
            ex,
            row_int4,
            msg_int4,
            msg_bytes,
            topk_n,
            counters_n,
            items_i,
            slots_per_counter,
            mode,
            launch_no,
            o,
            err,
            to
        ];
        // SAFETY: items ≤ max_items staged messages, topk rows and x rows (checked to fit the
        // `big`-byte src); recv slots are < counters_n × slots_per_counter, inside the
        // `big`-byte dst; expert indices are < counters_n, the size of counters, finish, flags
        // and expect; out holds 9 words per block; every block is resident (one 1,024-thread
        // block per SM at most), so the tail's polls wait only on running blocks.
        unsafe { dev.gpu.launch(f, blocks, 1024, &mut a) }
    };
    let us = time_us(devs, 0, 5, launch)?;
    devs.finish("low-latency send chain probe")?;
    let mut words = vec![0u64; blocks as usize * 9];
    devs.list[0].gpu.download(b.out.ptr, &mut words)?;
    let (per_block, cycles) = words.split_at(blocks as usize * 8);
    let start = per_block.chunks(8).map(|b| b[5]).min().unwrap_or(0);
    let loop_end = per_block.chunks(8).map(|b| b[6]).max().unwrap_or(0);
    let tail_end = per_block.chunks(8).map(|b| b[7]).max().unwrap_or(0);
    // Per block: ns per round and each step's share, cycles converted with the block's own
    // loop (clock64 cycles against %globaltimer ns); means over blocks.
    let mut steps = [0f64; 5];
    let mut counted = 0f64;
    for (b, c) in per_block.chunks(8).zip(cycles) {
        if b[0] == 0 || *c == 0 {
            continue;
        }
        let ns_per_cycle = (b[6] - b[5]) as f64 / *c as f64;
        let r = b[0] as f64;
        steps[0] += (b[6] - b[5]) as f64 / r;
        for k in 1..5 {
            steps[k] += b[k] as f64 * ns_per_cycle / r;
        }
        counted += 1.0;
    }
    let mean = |v: f64| round3(v / counted.max(1.0));
    let shape = LlSendShape {
        launch_us: round3(us),
        loop_us: round3(loop_end.saturating_sub(start) as f64 / 1e3),
        tail_us: round3(tail_end.saturating_sub(loop_end) as f64 / 1e3),
        ns_per_round: mean(steps[0]),
        cast_barrier_ns: mean(steps[1]),
        index_atomic_ns: mean(steps[2]),
        copy_ns: mean(steps[3]),
        release_loop_ns: mean(steps[4]),
    };
    Ok((shape, us))
}

/// Device buffers of the send chain probe (one counters region: slot counters, finish
/// counters, count flags, `LL_RANKS · LL_EXPERTS` ints each).
#[derive(Clone, Copy)]
struct LlSendBufs {
    x: u64,
    staging: u64,
    recv: u64,
    topk: u64,
    ctrs: u64,
}

/// The receive loop's steps per message (`LL_RECV_*` in kernels/cuda/probes.cu): the header
/// load, the payload copy, the scale loads, the discard.
const RECV_HEADER: i32 = 1;
const RECV_PAYLOAD: i32 = 2;
const RECV_SCALES: i32 = 4;
const RECV_DISCARD: i32 = 8;
const RECV_ALL: i32 = RECV_HEADER | RECV_PAYLOAD | RECV_SCALES | RECV_DISCARD;

/// The low-latency dispatch's receive loop (`probe_ll_recv`) right after a full send launch
/// (`probe_ll_send`, every step, with the count signalling) of `items` items, as hook mode
/// runs the two kernels: both launches timed together (CUDA events, L2 flushed before), the
/// receive's part as that less `send_us` (the send alone, same shape), the receive launch's
/// own span (%globaltimer), and one receive group's poll and message time per item. `packed`
/// is `packed_bytes` of scratch for the packed rows; `steps` the receive's steps to run
/// (`RECV_*`).
#[allow(clippy::too_many_arguments)]
fn ll_recv_after_send(
    devs: &mut Devices,
    b: LlSendBufs,
    expect: &[i32],
    blocks: u32,
    items: usize,
    slots_per_counter: i32,
    packed: u64,
    packed_bytes: usize,
    send_us: f64,
    steps: i32,
) -> Result<LlRecvShape, HwError> {
    let local = LL_EXPERTS / LL_RANKS;
    let counters_n = (LL_RANKS * LL_EXPERTS) as i32;
    let payload_int4 = (LL_HIDDEN / 16) as i32;
    let num_scales = (LL_HIDDEN / 128) as i32;
    // Packed rows per local expert: what every source sends it.
    let mut capacity = 0usize;
    for lr in 0..LL_RANKS {
        for le in 0..local {
            let rows: i32 = (0..LL_RANKS).map(|s| expect[s * LL_EXPERTS + lr * local + le]).sum();
            capacity = capacity.max(rows as usize);
        }
    }
    let rows = LL_RANKS * local * capacity;
    if rows * LL_HIDDEN > packed_bytes {
        return Err(HwError::Setup {
            context: "low-latency receive probe".into(),
            message: format!("{rows} packed rows of {LL_HIDDEN} B do not fit {packed_bytes} B"),
        });
    }
    let (side, rout) = {
        let g = &devs.list[0].gpu;
        let side = g.alloc(rows * (LL_HIDDEN / 128 * 4 + 8))?;
        let rout = g.alloc(blocks as usize * 8 * 8)?;
        g.memset_u8(b.ctrs, 0, 3 * counters_n as usize * 4)?;
        (side, rout)
    };
    devs.clear_errors()?;
    let g = &devs.list[0].gpu;
    let expect_buf = g.alloc(counters_n as usize * 4)?;
    g.upload(&expect_buf, expect)?;
    let (counters, finish, flags) =
        (b.ctrs, b.ctrs + counters_n as u64 * 4, b.ctrs + 2 * counters_n as u64 * 4);
    let (scales, info) = (side.ptr, side.ptr + (rows * (LL_HIDDEN / 128 * 4)) as u64);
    let (ex, err, to) = (expect_buf.ptr, devs.list[0].err.ptr, devs.timeout_ns());
    let send_out = g.alloc(blocks as usize * 9 * 8)?;
    let (so, ro) = (send_out.ptr, rout.ptr);
    let (row_int4, msg_int4, msg_bytes) = (LL_ROW_INT4, LL_MSG_INT4, LL_MSG_STRIDE as i32);
    let (topk_n, items_i, mode) = (LL_TOPK as i32, items as i32, 15i32);
    let (ranks, local_i, cap, wpg) = (LL_RANKS as i32, local as i32, capacity as i32, 4i32);
    let mut launch_no = 0i32;
    let both = |dev: &Device| {
        launch_no += 1;
        let f = dev.module("probes")?.function("probe_ll_send");
        let mut a = kernel_args![
            b.x,
            b.staging,
            b.recv,
            b.topk,
            counters,
            finish,
            flags,
            ex,
            row_int4,
            msg_int4,
            msg_bytes,
            topk_n,
            counters_n,
            items_i,
            slots_per_counter,
            mode,
            launch_no,
            so,
            err,
            to
        ];
        // SAFETY: as in send_shape (same buffers, items and grid).
        unsafe { dev.gpu.launch(f, blocks, 1024, &mut a)? };
        let f = dev.module("probes")?.function("probe_ll_recv");
        let mut a = kernel_args![
            b.recv,
            flags,
            packed,
            scales,
            info,
            msg_bytes,
            payload_int4,
            num_scales,
            ranks,
            local_i,
            slots_per_counter,
            cap,
            wpg,
            steps,
            launch_no,
            ro,
            err,
            to
        ];
        // SAFETY: the messages read are the slots the send launch just filled (counter ×
        // slots_per_counter + slot, inside recv); packed rows < LL_RANKS × local × capacity fit
        // `packed_bytes` (checked) and the side buffer holds their scales and two info ints;
        // rout holds 8 words per block; the flags the receive polls were all set by the send
        // launch before it, on the same stream.
        unsafe { dev.gpu.launch(f, blocks, 1024, &mut a) }
    };
    let us = time_us(devs, 0, 5, both)?;
    devs.finish("low-latency receive probe")?;
    let mut words = vec![0u64; blocks as usize * 8];
    devs.list[0].gpu.download(rout.ptr, &mut words)?;
    let start = words.chunks(8).map(|w| w[4]).min().unwrap_or(0);
    let end = words.chunks(8).map(|w| w[5]).max().unwrap_or(0);
    let (mut poll_ns, mut msg_ns, mut n_items, mut n_msgs) = (0f64, 0f64, 0f64, 0f64);
    for w in words.chunks(8) {
        if w[0] == 0 || w[6] == 0 {
            continue;
        }
        let ns_per_cycle = (w[5] - w[4]) as f64 / w[6] as f64;
        poll_ns += w[2] as f64 * ns_per_cycle;
        msg_ns += w[3] as f64 * ns_per_cycle;
        n_items += w[0] as f64;
        n_msgs += w[1] as f64;
    }
    let per_item = |v: f64| round3(v / n_items.max(1.0));
    Ok(LlRecvShape {
        launch_us: round3(us),
        recv_us: round3(us - send_us),
        recv_loop_us: round3(end.saturating_sub(start) as f64 / 1e3),
        poll_ns_per_item: per_item(poll_ns),
        messages_ns_per_item: per_item(msg_ns),
        messages_per_item: per_item(n_msgs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ll_probe_routing_is_top8_of_the_items_rank() {
        let items = 1024;
        let topk = ll_probe_topk(items);
        assert_eq!(topk.len(), items * LL_TOPK);
        for (it, row) in topk.chunks(LL_TOPK).enumerate() {
            let rank = it % LL_RANKS;
            let mut experts: Vec<usize> =
                row.iter().map(|&c| c as usize - rank * LL_EXPERTS).collect();
            assert!(experts.iter().all(|&e| e < LL_EXPERTS), "item {it}: {row:?}");
            experts.sort_unstable();
            experts.dedup();
            assert_eq!(experts.len(), LL_TOPK, "item {it}: distinct experts");
        }
        // The message stride the kernels use (hw/src/low_latency/mod.rs), and the probe's sizes.
        assert_eq!(LL_MSG_STRIDE as u64, crate::low_latency::msg_stride(LL_HIDDEN as u32, true));
        assert_eq!(LL_MSG_INT4 * 16, 16 + 7168 + 224);
        assert_eq!(LL_ROW_INT4, 896);
    }
}
