"""The TRL side of bench/vs_trl.py: TRL's GRPOTrainer in one process on the same model, prompts, reward and held-out
evaluation as the services. Run by vs_trl.py with TRL on PYTHONPATH (installed into its own folder); prints one
JSON line per evaluation and a summary line, each prefixed with RESULT.

Same as ours: the prompts and their rendering (services.common.tasks: load_task, PromptRenderer's system prompt
and chat template), the reward (services.common.rewards.BUILTIN[...]) and what counts as correct
(rewards.full_marks). Evaluation: greedy, max_tokens new tokens, every eval_every steps, its time kept apart.
Every setting that changes a step comes from the same config through bench/trl_pairing.py (TO_TRL); the
differences left are trl_pairing.KNOWN_DIFFERENCES, each with its reason.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_EPOCHS = 20  # of the training prompts given to TRL in our order (a 20-minute GPU run takes ~17 of 4416)
sys.path.insert(0, str(REPO))

from trl_pairing import trl_kwargs  # noqa: E402

from services.common.config import RunConfig  # noqa: E402
from services.common.rewards import BUILTIN, full_marks  # noqa: E402
from services.common.tasks import Prompt, PromptOrder, PromptRenderer, load_task  # noqa: E402


def emit(kind: str, **fields) -> None:
    print("RESULT" + json.dumps({"kind": kind, **fields}), flush=True)


def messages(renderer: PromptRenderer, p: Prompt) -> list[dict] | str:
    """TRL renders conversational prompts with the tokenizer's chat template itself; raw prompts stay text."""
    return renderer.messages(p) if renderer.uses_template else p.text


def evaluate(model, renderer: PromptRenderer, prompts: list[Prompt], reward, max_tokens: int, bf16: bool) -> dict:
    import torch

    tok = renderer.tokenizer
    ids = [renderer.ids(p) for p in prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(i) for i in ids)
    batch = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    was_training = model.training
    model.eval()
    with torch.no_grad(), torch.autocast(model.device.type, torch.bfloat16, enabled=bf16):
        out = model.generate(
            input_ids=batch.to(model.device),
            attention_mask=mask.to(model.device),
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=pad,
        ).cpu()
    model.train(was_training)
    texts = [tok.decode(row[width:], skip_special_tokens=True) for row in out]
    finish = ["stop" if (row[width:] == tok.eos_token_id).any() else "length" for row in out]
    scores = [
        reward(p.text, t, p.answer, {**p.metadata, "finish_reason": f}) for p, t, f in zip(prompts, texts, finish)
    ]
    lengths = [int((row[width:] != pad).sum()) for row in out]
    return {
        "accuracy": sum(full_marks(s) for s in scores) / len(scores),
        "mean_length": sum(lengths) / len(lengths),
        "samples": [{"prompt": p.text, "completion": t, "reward": s} for p, t, s in zip(prompts[:4], texts, scores)],
    }


def grpo_config(cfg: RunConfig, work: str, gradient_checkpointing: bool, gpu: bool = False, here: bool = True):
    """TRL's GRPOConfig: every setting that changes a step from our config through trl_pairing.TO_TRL (and TO_TRL_GPU
    with gpu: vLLM colocated on the trainer's GPU), the rest TRL's plumbing (where it writes, how often it logs, no
    saving, the device; here=False resolves a GPU config on a machine without one, to print it)."""
    import trl

    return trl.GRPOConfig(
        **trl_kwargs(cfg, gpu),
        output_dir=str(Path(work) / "trl"),
        gradient_checkpointing=gradient_checkpointing,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not (gpu and here),
        disable_tqdm=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="the resolved run config both sides use (TOML)")
    parser.add_argument("--work", required=True)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="as the reference TRL run")
    parser.add_argument("--gpu", action="store_true", help="on the GPU, sampling with vLLM colocated (TO_TRL_GPU)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved GRPOConfig (JSON), no run")
    args = parser.parse_args()
    cfg = RunConfig.model_validate(tomllib.loads(Path(args.config).read_text()))
    if args.print_config:  # what tests/integration/test_trl_pairing.py compares with our side
        config = grpo_config(cfg, args.work, args.gradient_checkpointing, args.gpu, here=False)
        print(json.dumps(config.to_dict(), default=str))
        return 0

    launched = time.monotonic()  # start-up (imports, the model, TRL's trainer and its vLLM) is reported apart
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    torch.set_num_threads(cfg.trainer.num_threads)
    torch.manual_seed(cfg.run.seed)
    c, run = cfg.coordinator, cfg.run
    data = load_task(cfg.task)
    renderer = PromptRenderer(cfg.model.path, cfg.task.system_prompt, cfg.task.chat_template)
    [reward_name] = cfg.task.reward_weights()
    reward = BUILTIN[reward_name]
    # The training prompts in the order our coordinator takes them (PromptOrder, the run seed: a fresh permutation
    # every epoch), with TRL's own shuffle off: both sides then train on the same prompts at every step, so their
    # per-step curves differ by the sampling alone. As many epochs as the run can take, up to MAX_EPOCHS (a run
    # bounded by minutes only would otherwise ask for its 100000 steps' worth): beyond, TRL repeats them.
    epochs = min(math.ceil(run.num_steps * c.num_prompts / len(data.train)), MAX_EPOCHS)
    order = PromptOrder(len(data.train), run.seed).take(epochs * len(data.train))
    train = [data.train[i] for i in order]
    rows = {
        "prompt": [messages(renderer, p) for p in train],
        "text": [p.text for p in train],
        "answer": [p.answer for p in train],
        "metadata_json": [json.dumps(p.metadata) for p in train],
    }

    def reward_fn(prompts, completions, completion_ids, answer, metadata_json, text, **_):
        texts = [x[-1]["content"] if isinstance(x, list) else x for x in completions]
        # As vLLM's finish_reason on our side: "stop" where the completion ends with EOS, "length" where it was cut.
        finish = ["stop" if ids and ids[-1] == renderer.tokenizer.eos_token_id else "length" for ids in completion_ids]
        scores = [
            reward("", t, a, {**json.loads(m), "num_tokens": len(ids), "finish_reason": f})
            for t, a, m, ids, f in zip(texts, answer, metadata_json, completion_ids, finish)
        ]
        # This step's prompts, in order (one call per step), and its rewards.
        emit("batch", prompts=list(dict.fromkeys(text)), rewards=scores, tokens=sum(map(len, completion_ids)))
        scored_at.append(time.monotonic())  # the step's generation (and its weight sync to vLLM) ends here
        return scores

    scored_at: list[float] = []

    budget_s = run.train_minutes * 60

    class Clock(TrainerCallback):
        """Training seconds from the first step, evaluations excluded; evaluates every eval_every steps."""

        def __init__(self):
            self.start, self.eval_s, self.model = time.monotonic(), 0.0, None
            self.step_began = 0.0

        def train_s(self) -> float:
            return time.monotonic() - self.start - self.eval_s

        def record(self, step: int) -> None:
            started = time.monotonic()
            result = evaluate(self.model, renderer, data.eval, reward, c.max_tokens, config.bf16)
            self.eval_s += time.monotonic() - started
            train_s = self.train_s() if step else 0.0
            emit("eval", step=step, train_s=train_s, eval_s=time.monotonic() - started, **result)

        def on_train_begin(self, args, state, control, model=None, **_):
            self.model = model
            emit("startup", seconds=time.monotonic() - launched)
            self.record(0)
            self.start, self.eval_s = time.monotonic(), 0.0  # the clock starts at the first step

        def on_step_begin(self, args, state, control, **_):
            if state.global_step % cfg.trainer.minibatches == 0:  # the first optimizer step of a generated batch
                self.step_began = time.monotonic()

        def on_step_end(self, args, state, control, **_):
            # TRL counts optimizer steps: trainer.minibatches of them make one of our steps (one generated batch).
            if state.global_step % cfg.trainer.minibatches:
                return
            step = state.global_step // cfg.trainer.minibatches
            # The step's time, split where its rewards were scored: before, the weight sync and generation; after,
            # the advantages, log-prob passes, loss, backward and optimizer (TRL's step is one process).
            total_s = time.monotonic() - self.step_began
            generation_s = scored_at[-1] - self.step_began if scored_at else None
            emit("step", step=step, train_s=self.train_s(), total_s=total_s, generation_s=generation_s)
            if budget_s and self.train_s() >= budget_s:
                control.should_training_stop = True
            if step % run.eval_every == 0 or control.should_training_stop:
                self.record(step)

    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)
    tok = renderer.tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    config = grpo_config(cfg, args.work, args.gradient_checkpointing, args.gpu)
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[reward_fn],
        args=config,
        train_dataset=Dataset.from_dict(rows),
        processing_class=tok,
        callbacks=[Clock()],
    )
    start = time.monotonic()
    trainer.train()
    emit("done", trl_version=trl.__version__, wall_s=time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
