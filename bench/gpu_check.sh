#!/usr/bin/env bash
# The GPU path in one strict, short script: stops at the first failing step, sized for 8 minutes on one H200
# (not yet run on a GPU; BUDGET_S, default 480 s: every step runs under what is left of it), one summary table.
#
#   bench/gpu_check.sh              on a GPU machine: GPT-2 124M, ZeRO-3, bf16 (NCCL for CUDA tensors)
#   bench/gpu_check.sh --dry-run    the same steps on the CPU with tiny settings (gpt2-tiny, 2 gloo ranks;
#                                   419 s on the 2-core dev box: too long for the suite, hence --plan there)
#   bench/gpu_check.sh --plan       load every step's config through d3ray's loader and preflight, print the
#                                   commands, run nothing (seconds; CI runs it: tests/unit/test_gpu_check_plan.py)
#   (--dry-run --plan: the plan of the dry run; NGPU=1|2 sets the GPU count a --plan plans for, default 2)
#
# Steps:
#   1. d3-actors: D3 with the influence actor on a quarter GPU (eager attention for its Hessian-vector
#      products, ZeRO-3 16-bit weight gathering for the snapshots); 2 trainer ranks where 2 GPUs exist
#      (each on a GPU of its own: 0.75 GPU each, the influence actor's 0.25 beside one of them), else 1;
#      an evaluation in the middle and at the end, so with 2 ranks the multi-worker evaluation path runs.
#      2 ranks on one GPU are refused by the config (two ranks would share the GPU), hence 1 on one GPU.
#   2. d3-in-trainer: schedule.placement.type=in_trainer (the trainers sketch on their ZeRO-3 shards).
#   3. influence: `d3ray bench influence --quick --device cuda` (cost ratio vs a training step, fidelity).
#   4. pipeline: `d3ray bench pipeline` D3 vs random order, one pair (throughput ratio, trainer wait).
#   5. capacity: `d3ray bench influence-capacity --device cuda`, writes $OUT/gpu_constants.json (MFU of a
#      bf16 training step and of the influence forward+backward, seconds per coordinate, peak FLOP/s),
#      which `d3ray bench influence-capacity --gpu-constants FILE` then uses instead of its projections.
# While the steps run, nvidia-smi is sampled every second for each process's GPU memory, by role
# (trainer = Ray Train worker, influence = InfluenceWorker actor, scorer, other): the table's peak memory.
# Summary: tokens/s, MFU (6N + attention FLOPs per token against the measured peak), influence cost ratio,
# trainer wait, fallbacks, peak GPU memory per role; JSON and every step's log land in $OUT.
set -euo pipefail

MODE=gpu
PLAN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) MODE=dry ;;
    --plan) PLAN=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$arg' (use --dry-run, --plan)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
BUDGET_S=${BUDGET_S:-480}
DEADLINE=$((SECONDS + BUDGET_S))

if [ "$MODE" = gpu ]; then
  OUT=${OUT:-runs/gpu_check}
  if [ "$PLAN" = 1 ]; then
    NGPU=${NGPU:-2}
  else
    python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: no CUDA device (use --dry-run on the CPU)')"
    NGPU=$(python -c "import torch; print(torch.cuda.device_count())")
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  WORKERS=$((NGPU >= 2 ? 2 : 1))
  DEVICE=cuda
  TRAIN=(model.preset=gpt2-124m model.attn_implementation=sdpa data.seq_len=512
    train.num_workers=$WORKERS train.gpus_per_worker=0.75 train.cpus_per_worker=2 train.zero_stage=3
    train.global_batch_size=32 train.micro_batch_size=16 train.lr=6e-4 eval.max_sequences_per_domain=8
    train.checkpoint_every_chunks=100)  # one checkpoint, at the end: not ~1.7 GB per chunk
  SKETCH=(schedule.influence.sketch.type=gaussian schedule.influence.sketch.k=3500
    schedule.influence.sample_fraction=0.25 schedule.solver_pool.num_cpus=1)
  D3=("${SKETCH[@]}" schedule.placement.type=actors schedule.placement.num_gpus=0.25 schedule.placement.num_cpus=2)
  L=8 STEPS_ACTORS=32 EVAL_EVERY=16 STEPS_IN_TRAINER=16 STEPS_PIPELINE=32
  CAPACITY=(--device cuda --models small,gpt2-124m --batch-size 32 --seq-len 512 --threads 0
    --write-gpu-constants "$OUT/gpu_constants.json")
else
  OUT=${OUT:-runs/gpu_check_dry}
  NGPU=0 WORKERS=2 DEVICE=cpu
  TRAIN=(model.preset=gpt2-tiny data.seq_len=64 data.tokenizer.vocab_size=512
    train.num_workers=2 train.cpus_per_worker=0.5 train.zero_stage=3
    train.global_batch_size=8 train.micro_batch_size=2 train.warmup_steps=2 eval.max_sequences_per_domain=2
    train.checkpoint_every_chunks=100)
  SKETCH=(schedule.influence.sketch.type=gaussian schedule.influence.sketch.k=64
    schedule.influence.sample_fraction=0.25 schedule.solver_pool.num_cpus=1)
  D3=("${SKETCH[@]}")
  L=4 STEPS_ACTORS=8 EVAL_EVERY=4 STEPS_IN_TRAINER=8 STEPS_PIPELINE=8
  CAPACITY=(--device cpu --models tiny --batch-size 4 --seq-len 64 --repeats 1 --skip-allreduce
    --snapshot-presets gpt2-tiny)
fi
DATA=../shared/data/redpajama_sample/slimpajama_format
[ -d "$DATA/train" ] || DATA=shared/data/redpajama_sample/slimpajama_format
DATA_SET=()
if [ -d "$DATA/train" ]; then
  DATA_SET=(data.train_paths="[$DATA/train]" data.validation_paths="[$DATA/validation]")
fi
mkdir -p "$OUT/logs"
echo "gpu_check: mode $MODE$([ "$PLAN" = 1 ] && echo ' (plan)'), $NGPU GPUs, $WORKERS trainer ranks, budget ${BUDGET_S}s, out $OUT"

check_config() {  # the config a `d3ray pretrain` step would run, loaded and preflighted (nothing started)
  python - "$@" <<'PY'
import sys
from d3ray.cli import parse_args
from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.run.preflight import check_environment, cluster_problems

args = parse_args(["pretrain", *sys.argv[1:]])
cfg = load_config(RunConfig, args.config, args.overrides)
if cfg.model.attn_implementation != "flash_attention_2":
    check_environment(cfg)
ngpu = int(__import__("os").environ["GPU_CHECK_NGPU"])
problems = cluster_problems(cfg, [float(ngpu)]) if cfg.train.use_gpu else []
if problems:
    sys.exit(f"gpu_check: {cfg.name}: " + "; ".join(problems))
t = cfg.train
print(f"   config ok: {cfg.name}: {cfg.model.preset}, {t.num_workers} ranks x {t.gpus_per_worker:g} GPU, "
      f"ZeRO-{t.zero_stage}, {t.steps} steps, schedule {cfg.schedule.type_name}")
PY
}

STEP_LOG=()
step() {  # step NAME COMMAND...: run under what is left of the budget; stop the script if it fails
  local name=$1
  shift
  local left=$((DEADLINE - SECONDS))
  echo "== $name (${left}s of the budget left)"
  if [ "$PLAN" = 1 ]; then
    printf '  '
    printf ' %q' "$@"
    echo
    return
  fi
  if ((left <= 0)); then
    echo "gpu_check: FAILED: the ${BUDGET_S}s budget is spent before step '$name'" >&2
    exit 1
  fi
  echo "$name" >"$OUT/current_step"
  local t0=$SECONDS rc
  set +e
  timeout "$left" "$@" 2>&1 | tee "$OUT/logs/$name.log"
  rc=${PIPESTATUS[0]}
  set -e
  if ((rc != 0)); then
    ((rc == 124)) && echo "gpu_check: step '$name' ran past the ${BUDGET_S}s budget" >&2
    echo "gpu_check: FAILED at step '$name' (exit $rc); its log: $OUT/logs/$name.log" >&2
    exit "$rc"
  fi
  STEP_LOG+=("$name=$((SECONDS - t0))")
}

sample_gpu_memory() {  # every second: step,role,MiB of every process on a GPU (peak per role in the summary)
  set +e
  while sleep 1; do
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
      while IFS=', ' read -r pid mib; do
        cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)
        case "$cmd" in
          *RayTrainWorker*) role=trainer ;;
          *InfluenceWorker*) role=influence ;;
          *[Ss]cor*) role=scorer ;;
          *) role=other ;;
        esac
        echo "$(cat "$OUT/current_step" 2>/dev/null),$role,$mib"
      done >>"$OUT/gpu_memory.csv"
  done
}
if [ "$MODE" = gpu ] && [ "$PLAN" = 0 ]; then
  : >"$OUT/gpu_memory.csv"
  sample_gpu_memory &
  SAMPLER=$!
  trap 'kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null' EXIT
fi

ACTORS=(--name=gpu-d3 --output_dir="$OUT" --train.steps=$STEPS_ACTORS --train.eval_every=$EVAL_EVERY
  --schedule.type=d3 --schedule.L=$L "${TRAIN[@]/#/--}" "${D3[@]/#/--}" --schedule.placement.nice=19 "${DATA_SET[@]/#/--}")
IN_TRAINER=(--name=gpu-d3-in-trainer --output_dir="$OUT" --train.steps=$STEPS_IN_TRAINER --train.eval_every=0
  --schedule.type=d3 --schedule.L=$L --schedule.placement.type=in_trainer "${TRAIN[@]/#/--}"
  "${SKETCH[@]/#/--}" "${DATA_SET[@]/#/--}")
if [ "$PLAN" = 1 ]; then
  export GPU_CHECK_NGPU=$NGPU
  check_config "${ACTORS[@]}"
  check_config "${IN_TRAINER[@]}"
  check_config --name=pipeline --train.steps=$STEPS_PIPELINE --schedule.type=d3 --schedule.L=$L "${TRAIN[@]/#/--}" \
    "${D3[@]/#/--}" "${DATA_SET[@]/#/--}"
fi

step d3-actors d3ray pretrain "${ACTORS[@]}"
step d3-in-trainer d3ray pretrain "${IN_TRAINER[@]}"
step influence d3ray bench influence --quick --device "$DEVICE" --out "$OUT/influence.json" --workdir "$OUT/bench_influence"
step pipeline d3ray bench pipeline --scheduler d3 --repeats 1 --steps "$STEPS_PIPELINE" --L "$L" \
  --out "$OUT/pipeline.json" --work-dir "$OUT/pipeline" --set=schedule.placement.nice=0 "${D3[@]/#/--set=}" \
  "${TRAIN[@]}" "${DATA_SET[@]}"
step capacity d3ray bench influence-capacity "${CAPACITY[@]}" --out "$OUT/influence_capacity.json" \
  --workdir "$OUT/bench_capacity"
[ "$PLAN" = 1 ] && exit 0

python - "$OUT" "$MODE" "$NGPU" "$WORKERS" "$SECONDS" "${STEP_LOG[@]}" <<'PY'
"""The summary table of gpu_check: one row per step, n/a where a figure does not apply or is missing."""
import csv, json, math, sys
from pathlib import Path

out, mode, ngpu, workers, total = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
seconds = dict(s.split("=") for s in sys.argv[6:])


def load(path):
    return json.loads(path.read_text()) if path.exists() else {}


gpu = load(out / "gpu_constants.json")
peak_flops = gpu.get("peak_flops") if isinstance(gpu.get("peak_flops"), (int, float)) else None
peak = {}
if (out / "gpu_memory.csv").exists():
    for row in csv.reader((out / "gpu_memory.csv").open()):
        if len(row) == 3 and row[2].strip().isdigit():
            key = (row[0], row[1])
            peak[key] = max(peak.get(key, 0), int(row[2]))


def memory(step):
    roles = sorted((role, mib) for (s, role), mib in peak.items() if s == step)
    return " ".join(f"{role} {mib / 1024:.1f}" for role, mib in roles) or "n/a"


def flops_per_token(run_dir):
    """6N + 12·layers·width·seq (PaLM appendix B) from the last checkpoint's model.json."""
    from d3ray.lab.bench.pipeline import _model_numel

    described = sorted(run_dir.glob("checkpoint_*/model.json"))
    n = _model_numel(run_dir)
    if not described or n is None:
        return None
    c = json.loads(described[-1].read_text())["config"]
    layers, width = c.get("n_layer", c.get("num_hidden_layers")), c.get("n_embd", c.get("hidden_size"))
    seq = c.get("n_positions", c.get("max_position_embeddings"))
    return 6 * n + 12 * layers * width * seq


def fmt(x, spec=".3g"):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


rows = []
for step, name in (("d3-actors", "gpu-d3"), ("d3-in-trainer", "gpu-d3-in-trainer")):
    final = load(out / name / "final_metrics.json")
    tps = final.get("tokens_per_sec")
    fpt = flops_per_token(out / name) if final else None
    mfu = tps * fpt / peak_flops if tps and fpt and peak_flops else None
    wait = final.get("schedule/trainer_wait_sec")
    wait_s = f"{fmt(wait, '.1f')} s ({fmt(wait / final['train_seconds'], '.1%')})" if wait is not None else "n/a"
    rows.append([step, fmt(tps, ".0f"), fmt(mfu, ".1%"), "n/a", wait_s, fmt(final.get("schedule/fallbacks"), "d"),
                 memory(step)])
pipe = load(out / "pipeline.json")
ratio = pipe.get("throughput_ratio")
rows.append(["pipeline (d3/random)", f"x{ratio:.3f}" if ratio is not None else "n/a", "n/a", "n/a",
             fmt(pipe.get("trainer_wait_fraction"), ".1%"), "n/a", memory("pipeline")])
records = load(out / "influence.json").get("records", [])
default = [r for r in records if r.get("variant") == "first_order" and r.get("preconditioner") == "adam"]
ratios = " ".join(f"{r['variant']}/{r['preconditioner']} {fmt(r.get('cost_ratio'), '.2f')}" for r in default) or "n/a"
rows.append(["influence bench", "n/a", "n/a", ratios, "n/a", "n/a", memory("influence")])
rows.append(["capacity constants", "n/a",
             f"train {fmt(gpu.get('mfu_train'), '.1%')} infl {fmt(gpu.get('mfu_influence'), '.1%')}" if gpu else "n/a",
             "n/a", "n/a", "n/a", memory("capacity")])
head = ["step", "tokens/s", "MFU", "influence cost ratio", "trainer wait", "fallbacks", "peak GPU GiB by role"]
widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
print(f"\ngpu_check summary: mode {mode}, {ngpu} GPUs, {workers} trainer ranks, {total} s "
      f"({', '.join(f'{k} {v} s' for k, v in seconds.items())})")
for r in [head, ["-" * w for w in widths], *rows]:
    print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))
if gpu:
    print(f"GPU constants ({gpu.get('name')}) in {out}/gpu_constants.json: "
          f"d3ray bench influence-capacity --gpu-constants {out}/gpu_constants.json")
PY
