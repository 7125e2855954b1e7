# eptwin deepep launch: scenario deepep-one-rank-t128-k8-h2048 (sha256 65174f0e822853b9a4974a031ecc557aba6d29ed403a6ae9377e4b883d182a7e), job "ll": test_low_latency.py, 1 node(s) x 1 rank(s)
# Then: eptwin deepep import deepep-one-rank-t128-k8-h2048.node*.log --scenario <this scenario> --out <dir>

# node 0 of 1
( echo '[eptwin] launch scenario=deepep-one-rank-t128-k8-h2048 sha256=65174f0e822853b9a4974a031ecc557aba6d29ed403a6ae9377e4b883d182a7e script=test_low_latency.py nodes=1 launcher=shell node_rank=0 args: --num-processes 1 --num-tokens 128 --hidden 2048 --num-topk 8 --num-experts 288' && \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-8361} WORLD_SIZE=1 RANK=0 ${PYTHON:-python} /tmp/eptwin-deepep-standin/tests/test_low_latency.py --num-processes 1 --num-tokens 128 --hidden 2048 --num-topk 8 --num-experts 288 ) 2>&1 | tee deepep-one-rank-t128-k8-h2048.node0.log
