# DeepEP's one-rank low-latency kernels (scripts/deepep-one-rank.py runs) against the
# simulator's DeepEP model: for each run folder, a one-rank scenario with the run's shape and
# routing, fused and in hook mode, run on the model; prints one table row per run (DeepEP /
# model, µs) and per kernel a straight line through the token sweep (288 experts, top-8,
# hidden 7,168) for both.
#
#   python3 scripts/deepep-one-rank-compare.py RUNS_DIR [--profile h100-cx7]
#       [--eptwin target/release/eptwin] [--set section.key=value ...]
#
# --set adds [cluster.overrides.<section>] keys to every scenario (e.g.
# deepep.ll_recv_per_msg_ns=250), to see the model with other costs.
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

KERNELS = [("d_fused", "dispatch, fused"), ("c_fused", "combine, fused"),
           ("d_send", "dispatch send"), ("d_recv", "dispatch receive"),
           ("c_send", "combine send"), ("c_recv", "combine receive")]


def scenario(res, routing, hook, profile, overrides):
    ovr = ""
    for section, lines in overrides.items():
        ovr += f"[cluster.overrides.{section}]\n" + "\n".join(lines) + "\n"
    return f"""schema = 1
name = "ep1-t{res['tokens']}-{'hook' if hook else 'fused'}"
[cluster]
profile = "{profile}"
nodes = 1
gpus_per_node = 1
{ovr}
[[job]]
name = "ll"
[job.buffer]
low_latency_mode = true
num_rdma_bytes = "4GiB"
num_qps_per_rank = {res['experts']}
allow_nvlink_for_low_latency_mode = true
[job.workload]
tokens_per_rank = {res['tokens']}
hidden = {res['hidden']}
topk = {res['topk']}
experts = {res['experts']}
warmup = 1
iterations = 2
hook = {'true' if hook else 'false'}
routing = "file"
routing_file = "{routing}"
"""


def model(run_dir, res, args, overrides, tmp):
    out = {}
    for hook in (False, True):
        path = os.path.join(tmp, f"{os.path.basename(run_dir)}-{hook}.toml")
        with open(path, "w") as f:
            f.write(scenario(res, os.path.abspath(os.path.join(run_dir, "routing.json")), hook,
                             args.profile, overrides))
        r = subprocess.run([args.eptwin, "run", path, "--json", "--out", tmp],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"{path}: eptwin exited {r.returncode}\n{r.stderr}")
        doc = json.loads(r.stdout.splitlines()[-1])
        for op in doc["jobs"][0]["ops"]:
            s, o = op["summary"], op["op"][0]
            if hook:
                out[f"{o}_send"] = s["phases_us"]["send"]
                out[f"{o}_recv"] = s["phases_us"]["recv"]
            else:
                out[f"{o}_fused"] = s["latency_us"]["mean"]
    return out


def deepep(res):
    m = res["modes"]
    out = {"d_fused": m["fused"]["dispatch"]["kernel_us"],
           "c_fused": m["fused"]["combine"]["kernel_us"]}
    for o, op in (("d", "dispatch"), ("c", "combine")):
        out[f"{o}_send"] = m["hook"][op]["send_us"]
        out[f"{o}_recv"] = m["hook"][op]["recv_us"]
    return out


def line(xs, ys):
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs")
    ap.add_argument("--profile", default="h100-cx7")
    ap.add_argument("--eptwin", default="target/release/eptwin")
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    overrides = {}
    for kv in args.set:
        key, value = kv.split("=", 1)
        section, name = key.split(".", 1)
        overrides.setdefault(section, []).append(f"{name} = {value}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run_dir in sorted(glob.glob(os.path.join(args.runs, "t*"))):
            path = os.path.join(run_dir, "result.json")
            if not os.path.exists(path):
                continue
            res = json.load(open(path))
            rows.append((os.path.basename(run_dir), res, deepep(res),
                         model(run_dir, res, args, overrides, tmp)))
    rows.sort(key=lambda r: (r[1]["experts"] != 288, r[1]["tokens"], r[1]["topk"], r[1]["hidden"]))
    print("| run | " + " | ".join(name for _, name in KERNELS) + " |")
    print("|---|" + "---:|" * len(KERNELS))
    for tag, _, d, m in rows:
        cells = [f"{d[k]:.2f} / {m[k]:.2f}" for k, _ in KERNELS]
        print(f"| {tag} | " + " | ".join(cells) + " |")
    sweep = [r for r in rows if r[1]["experts"] == 288 and r[1]["topk"] == 8
             and r[1]["hidden"] == 7168]
    if len(sweep) > 1:
        print("\nstraight lines over the token sweep (µs at no tokens + ns per token):")
        xs = [r[1]["tokens"] for r in sweep]
        for k, name in KERNELS:
            a1, b1 = line(xs, [r[2][k] for r in sweep])
            a2, b2 = line(xs, [r[3][k] for r in sweep])
            print(f"  {name:18} DeepEP {a1:6.2f} + {b1 * 1e3:5.1f} ns/token   "
                  f"model {a2:6.2f} + {b2 * 1e3:5.1f} ns/token")


if __name__ == "__main__":
    main()
