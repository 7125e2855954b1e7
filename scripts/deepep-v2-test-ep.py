"""eptwin's equivalent of DeepEP V2's tests/elastic/test_ep.py (the wheel ships no tests),
written from docs/design.md ("DeepEP V2") and the wheel's API (deep_ep/buffers/elastic.py,
deep_ep/utils/): takes test_ep.py's flags (those `eptwin deepep launch` prints, and the
others), spawns --num-processes ranks, builds an ElasticBuffer, checks dispatch and combine the
way DeepEP's tests do (rows equal their source rank, combine = x times the ranks visited),
times the dispatch_impl / combine_impl kernels with kineto, and prints, after a
" > Testing with ..." line, one line per rank in test_ep.py's shape:
   * EP: {rank:3}/{n} | dispatch: {SO:.0f} GB/s (SO), {SU:.0f} GB/s (SU), {t:.3f} us, {su_bytes} bytes
   @ EP: ... | combine: ...
SO = scale-out bytes sent / t: hybrid mode (more than one scale-out domain) counts every
distinct scale-up domain of a token, its own included; direct mode every destination rank
outside the sender's NVLink domain (none at one rank).
SU = scale-up bytes received / t (docs/design.md, DeepEP V2 §5; the same counts as
eptwin's ElasticBytes). Dispatch is FP8 unless EPTWIN_V2_DISPATCH_DTYPE=bf16 (test_ep.py has
no flag for it)."""

import argparse
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def token_bytes(hidden, fp8):
    return hidden + hidden // 32 if fp8 else 2 * hidden


def run(local_rank, num_local_ranks, args):
    import deep_ep
    from deep_ep.utils.envs import init_dist
    from deep_ep.utils.testing import bench, bench_kineto
    from deep_ep.utils.math import per_token_cast_back, per_token_cast_to_fp8, calc_diff

    rank, num_ranks, group = init_dist(local_rank, num_local_ranks, args.seed)
    args.bf16 = os.environ.get('EPTWIN_V2_DISPATCH_DTYPE', 'fp8').lower() == 'bf16'
    torch.manual_seed(args.seed + rank)
    n_tok, hidden, k, experts = args.num_tokens, args.hidden, args.num_topk, args.num_experts
    if rank == 0:
        print(f'Config: ranks={num_ranks} tokens={n_tok} hidden={hidden} topk={k} experts={experts} '
              f'sms={args.num_sms} qps={args.num_qps} sl_idx={args.sl_idx} hybrid={args.allow_hybrid_mode} '
              f'deep_ep={deep_ep.__version__} nccl={torch.cuda.nccl.version()}', flush=True)
    buffer = deep_ep.ElasticBuffer(
        group, num_max_tokens_per_rank=n_tok, hidden=hidden, num_topk=k,
        use_fp8_dispatch=not args.bf16,
        allow_hybrid_mode=bool(args.allow_hybrid_mode),
        allow_multiple_reduction=bool(args.allow_multiple_reduction),
        prefer_overlap_with_compute=bool(args.prefer_overlap_with_compute),
        deterministic=args.deterministic, sl_idx=args.sl_idx, num_allocated_qps=args.num_allocated_qps,
        num_cpu_timeout_secs=args.num_cpu_timeout_secs, num_gpu_timeout_secs=args.num_gpu_timeout_secs,
        explicitly_destroy=True)
    so, su = buffer.get_logical_domain_size()
    print(f' > rank {rank}: logical domains {so} x {su}, physical {buffer.get_physical_domain_size()}, '
          f'allocated QPs {buffer.num_allocated_qps}', flush=True)

    print(f' > Testing with dispatch={"bf16" if args.bf16 else "fp8"}, num_sms={args.num_sms}, '
          f'num_qps={args.num_qps}', flush=True)

    # Routing as DeepEP's tests: scores |N(0,1)| + 1, top-k over every expert.
    scores = torch.randn((n_tok, experts), dtype=torch.float32, device='cuda').abs() + 1
    topk_idx = torch.topk(scores, k, dim=-1, sorted=False).indices.to(deep_ep.topk_idx_t)
    topk_weights = torch.ones((n_tok, k), dtype=torch.float32, device='cuda')
    # rank + 1 (DeepEP's tests use the rank): at one rank the data is not all zeros.
    x = torch.ones((n_tok, hidden), dtype=torch.bfloat16, device='cuda') * (rank + 1)
    x_in = x if args.bf16 else per_token_cast_to_fp8(x)

    # Check dispatch: every received row is constant, its source rank + 1 (FP8 cast back).
    recv_x, recv_topk_idx, recv_topk_weights, handle, _ = buffer.dispatch(
        x_in, topk_idx=topk_idx, topk_weights=topk_weights, num_experts=experts,
        num_sms=args.num_sms, num_qps=args.num_qps)
    # A failed check prints its `[testing]` line without "passed" (the import fails the
    # document) and the timing still runs.
    def check(name, ok):
        print(f'[testing] {name} (rank {rank}) ...' + (' passed' if ok else ''), flush=True)

    rows = recv_x if args.bf16 else per_token_cast_back(recv_x[0], recv_x[1])
    assert rows.dim() == 2 and rows.size(1) == hidden
    constant = rows.size(0) == 0 or torch.equal(rows.float().amax(dim=1), rows.float().amin(dim=1))
    check(f'dispatch: {rows.size(0)} received rows, each constant', constant)

    # Check combine: x reduced from every rank it visited (top-k weights 1).
    combine_in = (torch.ones((rows.size(0), hidden), dtype=torch.bfloat16, device='cuda') *
                  (rows[:, :1].to(torch.bfloat16) if rows.size(0) else 0))
    combined_x, _, _ = buffer.combine(combine_in, handle, num_sms=args.num_sms, num_qps=args.num_qps)
    visited = torch.zeros(n_tok, dtype=torch.float32, device='cuda')
    per_rank = experts // num_ranks
    for r in range(num_ranks):
        visited += ((topk_idx // per_rank) == r).any(dim=1).float()
    ref = x.float() * visited.unsqueeze(1)
    diff = calc_diff(combined_x.float(), ref)
    check(f'combine: x x ranks visited, diff {diff:.3e} < 5e-6', diff < 5e-6)

    if args.skip_perf_test:
        buffer.destroy()
        dist.barrier()
        return

    # Bytes as test_ep.py counts them.
    num_nvl = buffer.get_physical_domain_size()[1]
    dst, _ = (topk_idx // per_rank).sort(dim=1)
    first = torch.ones_like(dst, dtype=torch.bool)
    first[:, 1:] = dst[:, 1:] != dst[:, :-1]
    # Hybrid kernels only with more than one scale-out domain (eptwin's validator, the same rule).
    if args.allow_hybrid_mode and so > 1:
        dom, _ = (dst // max(su, 1)).sort(dim=1)
        so_tokens = int(dom.size(0) + (dom[:, 1:] != dom[:, :-1]).sum()) if dom.numel() else 0
    else:
        so_tokens = int((first & ((dst // num_nvl) != rank // num_nvl)).sum())
    su_tokens = rows.size(0)
    disp_bytes, comb_bytes = token_bytes(hidden, not args.bf16), 2 * hidden

    def do_dispatch():
        buffer.dispatch(x_in, topk_idx=topk_idx, topk_weights=topk_weights, num_experts=experts,
                        num_sms=args.num_sms, num_qps=args.num_qps)

    def do_combine():
        buffer.combine(combine_in, handle, num_sms=args.num_sms, num_qps=args.num_qps)

    def kernel_time(fn, name):
        # The kernel's time from kineto, as test_ep.py takes it; should the profiler table not
        # name the kernel once, the call's time from CUDA events (launch included), said so.
        try:
            return bench_kineto(fn, name, barrier_comm_profiling=True, suppress_kineto_output=True)
        except Exception as e:
            print(f' > rank {rank}: kineto could not time {name} ({type(e).__name__}: '
                  f'{str(e)[:200]}); CUDA events instead', flush=True)
            return bench(fn, num_warmups=10, num_tests=30)[0]

    t_d = kernel_time(do_dispatch, 'dispatch_impl')
    t_c = kernel_time(do_combine, 'combine_impl')
    for mark, name, t, b in (('*', 'dispatch', t_d, disp_bytes), ('@', 'combine', t_c, comb_bytes)):
        so_gbs = so_tokens * b / 1e9 / t if t > 0 else 0
        su_gbs = su_tokens * b / 1e9 / t if t > 0 else 0
        print(f'   {mark} EP: {rank:3}/{num_ranks} | {name}: {so_gbs:.0f} GB/s (SO), {su_gbs:.0f} GB/s (SU), '
              f'{t * 1e6:.3f} us, {su_tokens * b:.0f} bytes', flush=True)
    buffer.destroy()
    dist.barrier()


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--num-processes', type=int, default=8)
    p.add_argument('--num-tokens', type=int, default=4096)
    p.add_argument('--hidden', type=int, default=7168)
    p.add_argument('--num-topk', type=int, default=6)
    p.add_argument('--num-experts', type=int, default=256)
    p.add_argument('--num-sms', type=int, default=0)
    p.add_argument('--num-qps', type=int, default=0)
    p.add_argument('--num-allocated-qps', type=int, default=0)
    p.add_argument('--num-gpu-timeout-secs', type=int, default=100)
    p.add_argument('--num-cpu-timeout-secs', type=int, default=300)
    p.add_argument('--sl-idx', type=int, default=0)
    p.add_argument('--allow-hybrid-mode', type=int, default=1)
    p.add_argument('--allow-multiple-reduction', type=int, default=1)
    p.add_argument('--prefer-overlap-with-compute', type=int, default=0)
    p.add_argument('--deterministic', action='store_true')
    p.add_argument('--do-cpu-sync', action='store_true')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--skip-check', action='store_true')
    p.add_argument('--skip-perf-test', action='store_true')
    p.add_argument('--do-pressure-test', action='store_true')
    p.add_argument('--test-first-only', action='store_true')
    args = p.parse_args()
    try:
        mp.spawn(run, args=(args.num_processes, args), nprocs=args.num_processes)
    except Exception:
        traceback.print_exc()
        sys.exit(1)


if __name__ == '__main__':
    main()
