# DeepEP's own low-latency kernels, one rank on one GPU, timed as DeepEP's
# tests/test_low_latency.py times them (kernel durations from the profiler, fused and in hook
# mode with a large GEMM before each receive hook). With one rank every (token, expert) message
# stays on the GPU, so what is timed is the kernels' GPU work alone: the part of the simulator's
# DeepEP low-latency model that no NIC or NVLink enters (results/h100/deepep-one-rank/README.md).
#
# Needs a DeepEP V1 build importable as `deep_ep` (a binary wheel carried to the GPU machine)
# and NVSHMEM's host library on LD_LIBRARY_PATH. No NIC is needed: one PE, remote transport off.
#
#   python3 scripts/deepep-one-rank.py [OUT_DIR] [--tokens 128] [--hidden 7168] [--experts 288]
#       [--topk 8] [--iterations 20]
#
# It takes test_low_latency.py's flags too (--num-processes 1, --num-tokens, --hidden,
# --num-topk, --num-experts) and prints that script's per-rank lines, so that it stands in for
# it where DeepEP's tests are not installed (the wheel has none): put it at
# <dir>/tests/test_low_latency.py and `eptwin deepep launch SCENARIO --deepep-dir <dir>` runs it,
# `eptwin deepep import` reads what it prints (`eptwin calibrate` does both).
#
# OUT_DIR (else $EPTWIN_DEEPEP_OUT, else the working directory) gets result.json (the timings),
# routing.json (the routing the kernels ran, an eptwin routing file) and the profiler traces.
import argparse
import json
import os
import random
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.environ.get("EPTWIN_DEEPEP_OUT", "."))
    ap.add_argument("--tokens", "--num-tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--experts", "--num-experts", type=int, default=288)
    ap.add_argument("--topk", "--num-topk", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--num-processes", type=int, default=1)
    args = ap.parse_args()
    if args.num_processes != 1:
        sys.exit("this stand-in for test_low_latency.py runs one rank on one GPU (--num-processes 1)")
    os.makedirs(args.out, exist_ok=True)

    # One PE: no remote transport; NVLink multicast stays off (the GPU machine's rule).
    os.environ.setdefault("NVSHMEM_REMOTE_TRANSPORT", "none")
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29561", world_size=1, rank=0)
    torch.cuda.set_device(0)
    import deep_ep

    t, h, e, k = args.tokens, args.hidden, args.experts, args.topk
    group = dist.new_group([0])
    rdma_bytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(t, h, 1, e)
    buffer = deep_ep.Buffer(group, num_rdma_bytes=rdma_bytes, low_latency_mode=True,
                            num_qps_per_rank=e, allow_nvlink_for_low_latency_mode=True,
                            explicitly_destroy=True)

    # The test's inputs and routing (seed + rank, rank 0): scores first, top-k, 10 masked entries.
    # (The test's input rows are not random; these are drawn after the routing so that the
    # routing is the test's.)
    torch.manual_seed(1)
    random.seed(1)
    scores = torch.randn((t, e), dtype=torch.float32, device="cuda").abs() + 1
    topk_idx = torch.topk(scores, k, dim=-1, largest=True, sorted=True)[1]
    topk_weights = torch.randn((t, k), dtype=torch.float32, device="cuda").abs()
    for _ in range(10):
        topk_idx[random.randint(0, t - 1), random.randint(0, k - 1)] = -1
    x = torch.randn((t, h), dtype=torch.bfloat16, device="cuda") * 0.1

    (packed_x, packed_scales), recv_count, handle, _, _ = buffer.low_latency_dispatch(
        x, topk_idx, t, e, use_fp8=True, async_finish=False, return_recv_hook=False)
    torch.cuda.synchronize()
    # The experts' outputs: the dispatched rows cast back to BF16 (as the test's simulated GEMM).
    scale = packed_scales.float().repeat_interleave(128, dim=-1)
    expert_out = (packed_x.float() * scale).to(torch.bfloat16)
    combined, _, _ = buffer.low_latency_combine(expert_out, topk_idx, topk_weights, handle,
                                                return_recv_hook=False)
    torch.cuda.synchronize()
    # Check: each token is the weighted sum of its valid experts' copies of it.
    mask = (topk_idx >= 0).float()
    want = x.float() * (topk_weights * mask).sum(dim=1, keepdim=True)
    err = ((combined.float() - want).abs().max() / want.abs().max()).item()

    gemm_a = torch.randn((8192, 8192), dtype=torch.float, device="cuda")
    gemm_b = torch.randn((8192, 8192), dtype=torch.float, device="cuda")

    def step(hook_mode):
        _, _, hd, _, hook = buffer.low_latency_dispatch(
            x, topk_idx, t, e, use_fp8=True, async_finish=False, return_recv_hook=hook_mode)
        if hook_mode:
            gemm_a @ gemm_b
            hook()
        _, _, hook = buffer.low_latency_combine(expert_out, topk_idx, topk_weights, hd,
                                                return_recv_hook=hook_mode)
        if hook_mode:
            gemm_a @ gemm_b
            hook()

    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "deep_ep": getattr(deep_ep, "__file__", "?"), "tokens": t, "hidden": h, "experts": e,
           "topk": k, "iterations": args.iterations, "combine_check_max_rel_err": err,
           "masked": int((topk_idx < 0).sum().item()), "modes": {}}
    for hook_mode in (False, True):
        for _ in range(5):
            step(hook_mode)
        torch.cuda.synchronize()
        # As the test's bench_kineto: a large GEMM first, then the timed loop.
        gemm_a @ gemm_b
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iterations):
                step(hook_mode)
            torch.cuda.synchronize()
        name = "hook" if hook_mode else "fused"
        trace = os.path.join(args.out, f"trace-{name}.json")
        prof.export_chrome_trace(trace)
        kernels = [ev for ev in json.load(open(trace))["traceEvents"]
                   if ev.get("cat") == "kernel"]
        mode = {"kernel_names": sorted({ev["name"][:160] for ev in kernels})}
        for op in ("dispatch", "combine"):
            durs = [ev["dur"] for ev in sorted(kernels, key=lambda v: v["ts"])
                    if f"internode_ll::{op}" in ev["name"]]
            if not durs:
                continue
            if hook_mode:
                send, recv = durs[0::2], durs[1::2]
                mode[op] = {"send_us": sum(send) / len(send), "recv_us": sum(recv) / len(recv),
                            "launches": len(durs)}
            else:
                mode[op] = {"kernel_us": sum(durs) / len(durs), "launches": len(durs),
                            "min_us": min(durs), "max_us": max(durs)}
        # CUDA events around each op, as eptwin's backend times (launch included).
        if not hook_mode:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            d_ms, c_ms = [], []
            for _ in range(args.iterations):
                gemm_a @ gemm_b
                ev[0].record()
                _, _, hd, _, _ = buffer.low_latency_dispatch(x, topk_idx, t, e, use_fp8=True)
                ev[1].record()
                buffer.low_latency_combine(expert_out, topk_idx, topk_weights, hd)
                ev[2].record()
                torch.cuda.synchronize()
                d_ms.append(ev[0].elapsed_time(ev[1]))
                c_ms.append(ev[1].elapsed_time(ev[2]))
            mode["events_dispatch_us"] = 1e3 * sum(d_ms) / len(d_ms)
            mode["events_combine_us"] = 1e3 * sum(c_ms) / len(c_ms)
            events_d, events_c = [1e3 * v for v in d_ms], [1e3 * v for v in c_ms]
        res["modes"][name] = mode
        print(name, json.dumps(mode), flush=True)

    # test_low_latency.py's per-rank lines (docs/deepep-replay.md): the logical bytes it counts
    # per valid selection, over the profiler's kernel times.
    valid = int((topk_idx >= 0).sum().item())
    d_bytes, c_bytes = valid * (h + h // 128 * 4 + 16), valid * h * 2
    fused, hook = res["modes"]["fused"], res["modes"]["hook"]
    both = [a + b for a, b in zip(events_d, events_c)]
    print(f"[rank 0] Dispatch + combine bandwidth: {(d_bytes + c_bytes) / 1e3 / (sum(both) / len(both)):.2f} GB/s, "
          f"avg_t={sum(both) / len(both):.2f} us, min_t={min(both):.2f} us, max_t={max(both):.2f} us", flush=True)
    dt, ct = fused["dispatch"]["kernel_us"], fused["combine"]["kernel_us"]
    print(f"[rank 0] Dispatch bandwidth: {d_bytes / 1e3 / dt:.2f} GB/s, avg_t={dt:.2f} us | "
          f"Combine bandwidth: {c_bytes / 1e3 / ct:.2f} GB/s, avg_t={ct:.2f} us", flush=True)
    print(f"[rank 0] Dispatch send/recv time: {hook['dispatch']['send_us']:.2f} + "
          f"{hook['dispatch']['recv_us']:.2f} us | Combine send/recv time: "
          f"{hook['combine']['send_us']:.2f} + {hook['combine']['recv_us']:.2f} us", flush=True)

    routing = {"source": f"scripts/deepep-one-rank.py on {res['gpu']}, torch {res['torch']}, "
                         f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
               "num_experts": e, "topk": k, "tokens_per_rank": t,
               "topk_idx": [topk_idx.cpu().tolist()]}
    json.dump(routing, open(os.path.join(args.out, "routing.json"), "w"))
    json.dump(res, open(os.path.join(args.out, "result.json"), "w"), indent=1)
    buffer.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
