# eptwin deepep launch: scenario deepep-one-rank-t64-k8-h7168 (sha256 61a13caa9795632aad8a0c6706e6e7f46c8bcf26a232ee341407692c6fc3d5d5), job "ll": test_low_latency.py, 1 node(s) x 1 rank(s)
# Then: eptwin deepep import deepep-one-rank-t64-k8-h7168.node*.log --scenario <this scenario> --out <dir>

# node 0 of 1
( echo '[eptwin] launch scenario=deepep-one-rank-t64-k8-h7168 sha256=61a13caa9795632aad8a0c6706e6e7f46c8bcf26a232ee341407692c6fc3d5d5 script=test_low_latency.py nodes=1 launcher=shell node_rank=0 args: --num-processes 1 --num-tokens 64 --hidden 7168 --num-topk 8 --num-experts 288' && \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-8361} WORLD_SIZE=1 RANK=0 ${PYTHON:-python} /tmp/eptwin-deepep-standin/tests/test_low_latency.py --num-processes 1 --num-tokens 64 --hidden 7168 --num-topk 8 --num-experts 288 ) 2>&1 | tee deepep-one-rank-t64-k8-h7168.node0.log
