# eptwin deepep launch: scenario deepep-one-rank-t128-k8-h4096 (sha256 151d64773825024b62112146a0e09f704f6a97c8404b0ce4087ba4fb8ab18956), job "ll": test_low_latency.py, 1 node(s) x 1 rank(s)
# Then: eptwin deepep import deepep-one-rank-t128-k8-h4096.node*.log --scenario <this scenario> --out <dir>

# node 0 of 1
( echo '[eptwin] launch scenario=deepep-one-rank-t128-k8-h4096 sha256=151d64773825024b62112146a0e09f704f6a97c8404b0ce4087ba4fb8ab18956 script=test_low_latency.py nodes=1 launcher=shell node_rank=0 args: --num-processes 1 --num-tokens 128 --hidden 4096 --num-topk 8 --num-experts 288' && \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-8361} WORLD_SIZE=1 RANK=0 ${PYTHON:-python} /tmp/eptwin-deepep-standin/tests/test_low_latency.py --num-processes 1 --num-tokens 128 --hidden 4096 --num-topk 8 --num-experts 288 ) 2>&1 | tee deepep-one-rank-t128-k8-h4096.node0.log
