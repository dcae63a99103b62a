"""Distillation of an MTP drafter from its target (seed 003, sections 3.1-3.3).

The loss at every position is a feature regression (smooth L1 to the target's next hidden state,
EAGLE's) plus a token loss that moves from soft to hard: KL to the target's distribution over the draft
vocabulary at a temperature falling from `temperature[0]` to `temperature[1]`, weighted from
`soft_weight[0]` down to `soft_weight[1]`, and cross-entropy to the target's greedy token for the rest.
Teacher outputs come from the cached teacher pass (`data`), never from a rerun of the target.

Held-out evaluation drafts `eval_positions` tokens from every held-out position of the self-distilled
(greedy) sequences, feeding its own features back, exactly as at inference, and reports the acceptance
at each draft position (P(draft j right | drafts before it right)) and the mean accepted length.
Checkpoints (safetensors + JSON, optimizer moments included) are written every `save_every` steps and at
the end; `resume` continues from one.
"""

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from orchestrator.errors import HetspecError
from orchestrator.models import Transformer, load_tokenizer, resolve
from orchestrator.mtp.data import DataOptions, TeacherData, build_teacher_data
from orchestrator.mtp.model import MtpConfig, MtpModel

STATE_NAME = "trainer_state.safetensors"
HISTORY_NAME = "history.json"
LOGIT_ROWS = 512  # positions per slice of draft-vocabulary logits: 512 x 8192 fp32 = 16 MiB


@dataclass(frozen=True)
class TrainOptions:
    target: str
    out: Path
    tokens: int = 240_000
    distill_share: float = 0.7  # of the tokens from the target's own responses (the rest: stdlib source)
    response_tokens: int = 192
    draft_vocab: int = 8192
    epochs: int = 3
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    temperature: tuple[float, float] = (2.0, 1.0)
    soft_weight: tuple[float, float] = (0.9, 0.2)
    feature_weight: float = 1.0
    noise: float = 0.05  # gaussian noise on input features, relative to their RMS (drafts read their own)
    unroll: int = 3  # passes per batch, each reading the features the one before predicted
    unroll_decay: float = 0.5  # pass u's loss weighs decay^(u-1) (the first draft counts most)
    eval_positions: int = 6
    save_every: int = 50
    resume: bool = False
    seed: int = 0
    progress: bool = True

    def validate(self) -> None:
        checks = [(self.tokens >= 1000, "--tokens must be >= 1000"),
                  (2 <= self.draft_vocab, "--draft-vocab must be >= 2"),
                  (0 <= self.distill_share <= 1, "--distill-share must be in [0, 1]"),
                  (self.response_tokens >= 1, "--response-tokens must be >= 1"),
                  (self.epochs >= 1, "--epochs must be >= 1"), (self.batch_size >= 1, "--batch-size must be >= 1"),
                  (self.seq_len >= 8, "--seq-len must be >= 8"), (self.lr > 0, "--lr must be > 0"),
                  (self.unroll >= 1, "--unroll must be >= 1"),
                  (0 < self.unroll_decay <= 1, "--unroll-decay must be in (0, 1]"),
                  (all(t > 0 for t in self.temperature), "temperatures must be > 0"),
                  (all(0 <= w <= 1 for w in self.soft_weight), "soft weights must be in [0, 1]")]
        for ok, message in checks:
            if not ok:
                raise HetspecError(message)


def _schedule(start_end: tuple[float, float], progress: float) -> float:
    a, b = start_end
    return a + (b - a) * progress


def choose_draft_vocab(data: TeacherData, train: list[int], size: int) -> torch.Tensor:
    """The `size` target tokens the target predicts most often in the training split (then most frequent
    in its text), in target-id order."""
    rows = torch.cat([torch.arange(data.offsets[i], data.offsets[i + 1]) for i in train])
    vocab = int(max(data.argmax.max(), data.tokens.max())) + 1
    counts = torch.bincount(data.argmax[rows], minlength=vocab) * 4 + torch.bincount(data.tokens[rows],
                                                                                       minlength=vocab)
    return counts.topk(min(size, vocab)).indices.sort().values


def _windows(data: TeacherData, seqs: list[int], seq_len: int, gen: torch.Generator) -> list[tuple[int, int]]:
    """Every training sequence cut into windows of at most seq_len + 1 positions, shuffled."""
    out = []
    for i in seqs:
        s = data.sequence(i)
        for a in range(s.start, s.stop - 2, seq_len):
            out.append((a, min(a + seq_len + 1, s.stop)))
    order = torch.randperm(len(out), generator=gen).tolist()
    return [out[i] for i in order]


def _batch(data: TeacherData, windows: list[tuple[int, int]], to_draft: torch.Tensor):
    """Pairs (h_i, x_{i+1}) -> targets at i + 1, padded; mask marks real rows."""
    T = max(b - a for a, b in windows) - 1
    B, H = len(windows), data.hidden.shape[1]
    hidden, next_h = torch.zeros(B, T, H), torch.zeros(B, T, H)
    next_ids, labels = torch.zeros(B, T, dtype=torch.long), torch.full((B, T), -100, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for r, (a, b) in enumerate(windows):
        n = b - a - 1
        hidden[r, :n] = data.hidden[a:b - 1].float()
        next_h[r, :n] = data.hidden[a + 1:b].float()
        next_ids[r, :n] = data.tokens[a + 1:b]
        labels[r, :n] = to_draft[data.argmax[a + 1:b]]
        mask[r, :n] = True
    return hidden, next_ids, next_h, labels, mask


def _loss(model: MtpModel, batch, opts: TrainOptions, progress: float, gen: torch.Generator):
    """Pass 1 reads the target's states; pass u > 1 reads, at each position, the feature pass u - 1 predicted
    for it (what drafting position u reads at inference). Pass u's loss weighs unroll_decay^(u-1)."""
    hidden, next_ids, next_h, labels, mask = batch
    if opts.noise:
        rms = hidden.pow(2).mean(-1, keepdim=True).sqrt()
        hidden = hidden + opts.noise * rms * torch.randn(hidden.shape, generator=gen)
    tau = _schedule(opts.temperature, progress)
    h, y = next_h[mask], labels[mask]  # the same targets for every pass: gathered and scored once
    with torch.no_grad():
        teacher = [F.log_softmax(model.logits(rows) / tau, -1) for rows in h.split(LOGIT_ROWS)]
    total, metrics = 0.0, {}
    weights = [opts.unroll_decay ** u for u in range(opts.unroll)]
    for u in range(opts.unroll):
        feats = model(hidden, next_ids)
        loss, m = _pass_loss(model, feats[mask], h, y, teacher, tau, opts, progress)
        total = total + loss * weights[u] / sum(weights)
        metrics = metrics or m
        metrics[f"top1_pass{u + 1}"] = m["top1"]
        hidden = torch.cat([hidden[:, :1], feats[:, :-1].detach()], dim=1)
    metrics["loss"] = float(total.detach())
    return total, metrics


def _pass_loss(model: MtpModel, f, h, y, teacher: list, tau: float, opts: TrainOptions, progress: float):
    """f: the pass's features at the real positions, h: the target's next states there, y: its greedy
    tokens in draft-vocabulary ids (-100 outside). The token losses run over slices of LOGIT_ROWS positions
    (`teacher`: the target's log-probabilities at temperature tau, sliced alike): a [positions, draft
    vocab] tensor of a whole batch (64 MiB) is above glibc's mmap ceiling, so each one would be mapped,
    faulted in page by page and unmapped again, every pass."""
    scale = h.pow(2).mean().sqrt().clamp_min(1e-6)  # regression in units of the features' RMS
    feature = F.smooth_l1_loss(f / scale, h / scale)
    soft, hard, right = 0.0, 0.0, 0
    for fs, ys, ts in zip(f.split(LOGIT_ROWS), y.split(LOGIT_ROWS), teacher):
        student = model.logits(fs)
        soft = soft + F.kl_div(F.log_softmax(student / tau, -1), ts, log_target=True, reduction="sum")
        hard = hard + F.cross_entropy(student, ys, ignore_index=-100, reduction="sum")
        right += int(((student.argmax(-1) == ys) & (ys >= 0)).sum())
    labelled = int((y >= 0).sum())
    soft = soft / max(1, len(f)) * tau * tau  # KL per position ("batchmean")
    hard = hard / max(1, labelled)
    w = _schedule(opts.soft_weight, progress)
    loss = opts.feature_weight * feature + w * soft + (1 - w) * hard
    return loss, {"loss": loss.item(), "feature": feature.item(), "soft": soft.item(), "hard": hard.item(),
                  "top1": right / max(1, labelled)}


@torch.inference_mode()
def evaluate(model: MtpModel, data: TeacherData, seqs: list[int], positions: int, max_starts: int = 400) -> dict:
    """Acceptance per draft position on greedy held-out sequences, drafting as at inference: only where
    the drafter is asked to draft, after the prompt's last state and the target's first response token
    (never inside the chat template or the prompt, which a drafter learns by heart). Top-1 agreement
    over the same positions of the responses and over all of the source."""
    tried, right = [0] * positions, [0] * positions
    top1_all, n_all = 0, 0
    starts_per_seq = max(1, max_starts // max(1, len(seqs)))
    for i in seqs:
        s = data.sequence(i)
        n = s.stop - s.start
        first = max(0, int(data.starts[i]) - 1)  # feats[p] reads (h_p, x_{p+1}) and predicts x_{p+2}
        if n - 2 < first + 1:
            continue
        hidden, tokens, argmax = data.hidden[s].float(), data.tokens[s], data.argmax[s]
        cache = model.new_cache(n + positions + 1)
        feats = model.step(hidden[:-1], tokens[1:], cache, 0)  # teacher-forced: f predicts h_{i+1}
        pred = model.draft_ids[model.logits(feats).argmax(-1)]
        top1_all += int((pred[first:] == argmax[first + 1:]).sum())
        n_all += n - 1 - first
        if not bool(data.distilled[i]):
            continue
        step = max(1, (n - 2 - first) // starts_per_seq)
        for p in range(first, n - 2, step):  # draft after the pair (h_p, x_{p+1})
            f, tok, pos = feats[p], int(pred[p]), p + 1
            local = cache.clone()
            for j in range(positions):
                if p + 1 + j >= n:
                    break
                tried[j] += 1
                if tok != int(argmax[p + 1 + j]):
                    break
                right[j] += 1
                if j + 1 == positions or p + 2 + j >= n:
                    break
                f = model.step(f[None], torch.tensor([tok]), local, pos)[0]
                pos += 1
                tok = int(model.draft_ids[model.logits(f).argmax()])
    alpha = [r / t if t else 0.0 for r, t in zip(right, tried)]
    # P(drafts 1..j all right): what a step drafting j commits beyond the bonus token, summed
    all_right = [r / tried[0] if tried[0] else 0.0 for r in right]
    return {"alpha": alpha, "tried": tried, "all_right": all_right, "top1": top1_all / max(1, n_all),
            "mean_accepted_len": 1.0 + sum(all_right)}


def _save_state(out: Path, model: MtpModel, optim: torch.optim.Optimizer, step: int, history: list) -> None:
    model.save(out)
    moments = {}
    for i, p in enumerate(model.parameters()):
        st = optim.state.get(p)
        if st:
            moments[f"{i}.exp_avg"], moments[f"{i}.exp_avg_sq"] = st["exp_avg"], st["exp_avg_sq"]
            moments[f"{i}.step"] = st["step"].reshape(1).float()
    save_file(moments or {"empty": torch.zeros(1)}, str(out / STATE_NAME), metadata={"step": str(step)})
    (out / HISTORY_NAME).write_text(json.dumps(history, indent=1) + "\n")


def _load_state(out: Path, model: MtpModel, optim: torch.optim.Optimizer) -> tuple[int, list]:
    from safetensors import safe_open

    with safe_open(str(out / STATE_NAME), "pt") as f:
        step = int(f.metadata()["step"])
    moments = load_file(str(out / STATE_NAME))
    for i, p in enumerate(model.parameters()):
        if f"{i}.exp_avg" in moments:
            optim.state[p] = {"exp_avg": moments[f"{i}.exp_avg"], "exp_avg_sq": moments[f"{i}.exp_avg_sq"],
                              "step": moments[f"{i}.step"].reshape(())}
    return step, json.loads((out / HISTORY_NAME).read_text())


def train_drafter(opts: TrainOptions) -> dict:
    """Builds (or resumes) the drafter in `opts.out`; returns the final held-out report."""
    opts.validate()
    t_start = time.perf_counter()
    ckpt = resolve(opts.target)
    tokenizer = load_tokenizer(ckpt)
    data = build_teacher_data(ckpt, tokenizer, DataOptions(tokens=opts.tokens, distill_share=opts.distill_share,
                                                                 response_tokens=opts.response_tokens), progress=opts.progress)
    t_data = time.perf_counter() - t_start
    train, held_out = data.split()
    target = Transformer.load(ckpt.hf_dir, torch.device("cpu"), torch.float32, onednn=False)
    gen = torch.Generator().manual_seed(opts.seed)
    draft_ids = choose_draft_vocab(data, train, opts.draft_vocab)
    config = MtpConfig.for_target(target.spec, ckpt.key, opts.target, len(draft_ids))
    torch.manual_seed(opts.seed)
    model = MtpModel(config, target.embed.clone(), draft_ids)
    model.set_head(target.lm_head)
    del target
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=opts.lr, weight_decay=0.0)
    opts.out.mkdir(parents=True, exist_ok=True)
    step, history = 0, []
    if opts.resume and (opts.out / STATE_NAME).is_file():
        resumed = MtpModel.load(opts.out)
        if resumed.config != config or not torch.equal(resumed.draft_ids, draft_ids):
            raise HetspecError(f"{opts.out}: holds a drafter trained with other options; use another --out")
        model.load_state_dict(resumed.state_dict())
        step, history = _load_state(opts.out, model, optim)
    windows_per_epoch = len(_windows(data, train, opts.seq_len, torch.Generator()))
    steps_per_epoch = math.ceil(windows_per_epoch / opts.batch_size)
    total_steps = steps_per_epoch * opts.epochs
    to_draft = torch.full((max(config.vocab_size, int(data.argmax.max()) + 1),), -100, dtype=torch.long)
    to_draft[draft_ids] = torch.arange(len(draft_ids))
    bar = tqdm(total=total_steps, initial=step, desc="train-drafter", unit="step", disable=not opts.progress)
    t_train = time.perf_counter()
    for epoch in range(opts.epochs):
        windows = _windows(data, train, opts.seq_len, torch.Generator().manual_seed(opts.seed + epoch))
        for b in range(steps_per_epoch):
            if epoch * steps_per_epoch + b < step:
                continue  # resumed past it
            progress = step / max(1, total_steps - 1)
            lr = opts.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * progress))
            for group in optim.param_groups:
                group["lr"] = lr
            model.train()
            loss, metrics = _loss(model, _batch(data, windows[b * opts.batch_size:(b + 1) * opts.batch_size],
                                                to_draft), opts, progress, gen)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{metrics['loss']:.3f}", top1=f"{metrics['top1']:.2f}")
            entry = {"step": step, "epoch": epoch, "lr": lr, **metrics}
            if step % opts.save_every == 0 or step == total_steps:
                model.eval()
                entry["eval"] = evaluate(model, data, held_out, opts.eval_positions)
                history.append(entry)
                _save_state(opts.out, model, optim, step, history)
            else:
                history.append(entry)
    bar.close()
    report = history[-1].get("eval") or evaluate(model.eval(), data, held_out, opts.eval_positions)
    summary = {"target": opts.target, "options": {k: (str(v) if isinstance(v, Path) else v)
                                                  for k, v in asdict(opts).items()},
               "num_tokens": int(len(data.tokens)), "num_sequences": data.num_sequences,
               "num_held_out": len(held_out), "data_s": t_data, "train_s": time.perf_counter() - t_train,
               "total_s": time.perf_counter() - t_start, "steps": step, "held_out": report}
    (opts.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    from orchestrator.mtp.plots import plot_training

    plot_training(history, opts.out / "training.png")
    return summary
