#!/usr/bin/env bash
# The GPU path in one script, for a single-GPU machine (about 10 minutes on one H100/H200):
#   1. a GPT-2 124M D3 run of a few chunks: ZeRO-3, bf16, NCCL, SDPA attention for training,
#      influence actor on a fractional GPU (eager attention for its Hessian-vector products),
#      ZeRO-3 16-bit weight gathering for the snapshots;
#   2. the same with influence_placement in_trainer: the trainer sketches each next chunk on its ZeRO-3
#      shards (autograd.grad with NCCL reduce-scatter hooks; no influence actor, no snapshots);
#   3. the influence benchmark (cost ratio vs a training step, fidelity) in quick mode;
#   4. the pipeline benchmark (D3 vs random order: throughput ratio, trainer wait) on GPU;
#   5. the influence capacity benchmark on the GPU: writes $OUT/gpu_constants.json (memory, the MFU of a
#      bf16 training step and of the influence forward+backward, influence seconds per coordinate, this
#      host's ray.put/get), which `d3ray bench influence-capacity --gpu-constants FILE` then uses in place
#      of its projections (the interconnect stays projected: one GPU has no peer).
# Prints tokens/s, influence cost ratio and trainer wait; JSON lands in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this check needs a GPU')"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
DATA=../shared/data/redpajama_sample/slimpajama_format
DATA_ARGS=()
if [ -d "$DATA/train" ]; then
  DATA_ARGS=(--data.train_paths="[$DATA/train]" --data.validation_paths="[$DATA/validation]")
fi
GPU_TRAIN=(model.preset=gpt2-124m model.attn_implementation=sdpa data.seq_len=512
  train.num_workers=1 train.gpus_per_worker=0.5 train.cpus_per_worker=2 train.zero_stage=3
  train.global_batch_size=32 train.micro_batch_size=16 train.lr=6e-4 train.eval_every=0)
GPU_D3=(schedule.influence_num_gpus=0.25 schedule.influence_num_cpus=2 schedule.influence.sketch.type=gaussian
  schedule.solver_pool.num_cpus=1)

echo "== 1/5 GPT-2 124M D3 run (ZeRO-3, bf16, NCCL)"
time d3ray pretrain --name=gpu-d3 --output_dir="$OUT" --train.steps=48 --schedule.type=d3 --schedule.L=8 \
  --schedule.influence.sketch.k=3500 --schedule.influence.sample_fraction=0.25 \
  "${GPU_TRAIN[@]/#/--}" "${GPU_D3[@]/#/--}" "${DATA_ARGS[@]}" | tee "$OUT/pretrain.log" | grep -E "^step|^eval|finished|ppl|fallback" || true

echo "== 2/5 GPT-2 124M D3 run, influence_placement in_trainer (ZeRO-3 shards, no snapshots)"
time d3ray pretrain --name=gpu-d3-in-trainer --output_dir="$OUT" --train.steps=24 --schedule.type=d3 --schedule.L=8 \
  --schedule.influence_placement=in_trainer --schedule.influence.sketch.type=gaussian \
  --schedule.influence.sketch.k=3500 --schedule.influence.sample_fraction=0.25 --schedule.solver_pool.num_cpus=1 \
  "${GPU_TRAIN[@]/#/--}" "${DATA_ARGS[@]}" | tee "$OUT/pretrain_in_trainer.log" | grep -E "^step|^eval|finished|fallback" || true
echo "== 3/5 influence benchmark"
d3ray bench influence --quick --out "$OUT/influence.json"

echo "== 4/5 pipeline benchmark (D3 vs random order)"
d3ray bench pipeline --scheduler d3 --out "$OUT/pipeline.json" --work-dir "$OUT/pipeline" --steps 48 --L 8 \
  --set=schedule.influence.sketch.k=3500 --set=schedule.influence.sample_fraction=0.25 \
  --set=schedule.influence.param_filter=. --set=schedule.influence_nice=0 "${GPU_D3[@]/#/--set=}" \
  "${GPU_TRAIN[@]}" "${DATA_ARGS[@]/#--/}"

echo "== 5/5 influence capacity: GPU constants of the capacity model"
d3ray bench influence-capacity --device cuda --models small,gpt2-124m --batch-size 32 --seq-len 512 --threads 0 \
  --write-gpu-constants "$OUT/gpu_constants.json" --out "$OUT/influence_capacity.json"

python - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
final = json.loads((out / "gpu-d3" / "final_metrics.json").read_text())
pipe = json.loads((out / "pipeline.json").read_text())
print(f"GPT-2 124M D3: {final['tokens_per_sec']:.0f} tok/s over {final['steps']} steps")
sharded = json.loads((out / "gpu-d3-in-trainer" / "final_metrics.json").read_text())
rows = [json.loads(x) for x in (out / "gpu-d3-in-trainer" / "metrics.jsonl").read_text().splitlines() if x.strip()]
sketch_s = sum(r.get("time/in_trainer_influence_sec") or 0.0 for r in rows)
print(f"GPT-2 124M D3 in_trainer: {sharded['tokens_per_sec']:.0f} tok/s, sketching {sketch_s:.1f} s of "
      f"{sharded['train_seconds']:.1f} s training")
print(f"pipeline: throughput_ratio {pipe['throughput_ratio']:.3f}, trainer_wait_fraction {pipe['trainer_wait_fraction']:.3f}")
inf = json.loads((out / "influence.json").read_text())
rows = inf if isinstance(inf, list) else inf.get("records", [])
for r in rows:
    # records of d3ray bench influence: variant, preconditioner, cost_ratio, regret_L<chunk> (quick: L = 4)
    print(f"influence {r.get('model')} {str(r.get('variant')):<12} {str(r.get('preconditioner')):<5} cost_ratio {r.get('cost_ratio')} "
          f"regret {r.get('regret_L4')}")
gpu = json.loads((out / "gpu_constants.json").read_text())
print(f"capacity constants ({gpu['name']}): mfu_train {gpu['mfu_train']:.3f}, mfu_influence {gpu['mfu_influence']:.3f}, "
      f"coordinate_sec {gpu['coordinate_sec']:.3g}; on the CPU box: d3ray bench influence-capacity --gpu-constants {out}/gpu_constants.json")
PY
