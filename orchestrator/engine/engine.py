"""The speculative decoding engine: schedule -> propose -> verify -> commit -> emit."""

import itertools
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Callable

import torch

from orchestrator.acceptance_policy import AcceptancePolicy
from orchestrator.config import SamplingParams
from orchestrator.engine.acceptance import verify_request
from orchestrator.engine.detok import TextStream
from orchestrator.engine.drafter import Drafter, DraftProposal, DraftRequest
from orchestrator.engine.hidden_feed import HiddenFeed
from orchestrator.engine.overlap import PreDrafter
from orchestrator.engine.preemption import Preempter
from orchestrator.engine.scheduler import Scheduler
from orchestrator.engine.sequence import Sequence, Status
from orchestrator.engine.speculation import Candidate, KPolicy, Plan, next_draft_len
from orchestrator.engine.verify import VerifyResult
from orchestrator.errors import InvalidRequestError
from orchestrator.models import TargetRunner
from orchestrator.tracing import HOST_TRACK, Tracer, drafter_track, target_track
from protocol import StagingPool


@dataclass
class StepOutput:
    """What one step committed for one sequence."""

    seq_id: int
    token_ids: list[int]  # newly committed
    text: str  # newly emitted text
    finished: bool
    finish_reason: str | None = None


class Engine:
    """Runs requests over one target and (optionally) one drafter.

    `k_policy` chooses each sequence's draft length every step (`speculation.KPolicy`: auto, fixed,
    adaptive), `num_speculative_tokens` being the fixed k or the most it may choose; `tracer` records
    every phase as spans (off unless a profiling run or metrics want them); `staging` holds the host
    buffers a preempted sequence's K/V is swapped into; `acceptance` is the verify policy of requests
    that name none (`acceptance_policy`); `overlap` drafts the next step on a worker thread while the
    target verifies this one (`overlap.PreDrafter`); a drafter that `reads_hidden` gets the target's hidden
    states of committed positions as blocks packed for `block_transport` (`hidden_feed`).
    """

    def __init__(self, target: TargetRunner, tokenizer, drafter: Drafter | None = None,
                 num_speculative_tokens: int = 4, max_num_seqs: int = 16,
                 eos_token_ids: tuple[int, ...] = (), k_policy: str = "fixed", preemption: str = "auto",
                 tracer: Tracer | None = None, staging: StagingPool | None = None,
                 disable_by_batch_size: int | None = None, draft_len_schedule: tuple[tuple[int, int], ...] = (),
                 acceptance: AcceptancePolicy = AcceptancePolicy(), overlap: bool = False,
                 block_transport: str = "inline"):
        self.target = target
        self.acceptance = acceptance
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.k = num_speculative_tokens if drafter is not None else 0
        self.policy = KPolicy(k_policy, self.k, disable_by_batch_size, draft_len_schedule,
                              batched_drafter=drafter is not None and drafter.batched)
        self._expected = Plan({})  # this step's plan, with what the policy expects of it
        self.eos_token_ids = frozenset(eos_token_ids)
        self.staging = staging or StagingPool(target.device)
        self.preempter = Preempter(target, preemption, self.staging)
        self.scheduler = Scheduler(target.pool, max_num_seqs, preempt=lambda seq: self.preempter.preempt(seq.seq_id))
        pool_tokens = target.pool.num_blocks * target.pool.block_size
        # longest sequence we can hold: a verify step adds up to k + 1 positions at once
        self.max_len = min(target.max_context, pool_tokens - self.k - 1)
        self.sequences: dict[int, Sequence] = {}
        self._streams: dict[int, TextStream] = {}
        self._ids = itertools.count()
        self.tracer = tracer or Tracer(enabled=False)
        self.num_steps = 0
        self._host = HOST_TRACK
        self._target_track = target_track(target.device)
        self._drafter_track = drafter_track(drafter.device, drafter.name) if drafter is not None else None
        self._flows: dict[int, int] = {}  # seq_id -> flow of this step's draft ids
        self.overlap: PreDrafter | None = None
        if overlap and self.drafter is not None:
            if not drafter.overlaps:
                raise InvalidRequestError(f"drafter {drafter.name} cannot draft ahead: overlap needs a single drafter",
                                          "overlap")
            self.overlap = PreDrafter(drafter, self.tracer, self._drafter_track, self.policy.cost)
        self.hidden_feed = HiddenFeed(drafter, target.model_id, block_transport, self.tracer) \
            if drafter is not None and drafter.reads_hidden else None

    # ---- requests --------------------------------------------------------------------

    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> int:
        params.validate()
        if not prompt_ids:
            raise InvalidRequestError("prompt is empty", "prompt")
        if len(prompt_ids) >= self.max_len:
            raise InvalidRequestError(f"prompt has {len(prompt_ids)} tokens; the context limit is {self.max_len}",
                                      "prompt")
        vocab = self.target.vocab_size
        bad = next((i for i, t in enumerate(prompt_ids) if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt: token id {prompt_ids[bad]} at position {bad} is outside the "
                                      f"vocabulary [0, {vocab})", "prompt")
        k = self.k if params.speculate else 0
        if params.num_speculative_tokens is not None:  # a request may draft less, never more
            k = min(k, params.num_speculative_tokens)
        seq = Sequence(seq_id=next(self._ids), prompt_ids=list(prompt_ids), params=params, k=k, draft_len=k,
                       policy=params.policy(self.acceptance))
        seq.stats.acceptance, seq.stats.lossy = seq.policy.name, seq.policy.lossy
        if params.seed is not None:
            seq.generator = torch.Generator().manual_seed(params.seed)
        self.sequences[seq.seq_id] = seq
        self._streams[seq.seq_id] = TextStream(self.tokenizer, params.stop)
        self.scheduler.add(seq)
        return seq.seq_id

    def cancel(self, seq_id: int) -> None:
        seq = self.sequences.get(seq_id)
        if seq is not None and seq.status is not Status.FINISHED:
            self._finish(seq, "cancelled")

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- the step --------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        with self.tracer.span("schedule", self._host, step=self.num_steps):
            seqs = self.scheduler.schedule()
            self.preempter.restore([seq.seq_id for seq in seqs])
        if not seqs:
            return []
        drafts = self._propose(seqs)
        try:
            if self.overlap is not None:
                self._draft_ahead(seqs, drafts)
            results = self._verify(seqs, drafts)
        finally:
            if self.overlap is not None:  # the drafter is free again (commits tell it the tokens)
                self.overlap.wait()
        outputs = [self._commit(seq, drafts[seq.seq_id], res) for seq, res in zip(seqs, results)]
        self.num_steps += 1
        self.tracer.flush()  # reads device timers: one sync per step, after the work
        return outputs

    def _plan(self, seqs: list[Sequence]) -> Plan:
        """Each sequence's k for this step, from the policy (the cost model sees the whole batch)."""
        candidates = [Candidate(seq.seq_id, self._draft_cap(seq), seq.num_tokens - self.target.kv_length(seq.seq_id),
                                seq.acceptance, self._drafter_lag(seq), seq.remaining,
                                ahead=self.overlap is not None and seq.params.greedy, opening=self._opening(seq))
                      for seq in seqs]
        return self.policy.plan(candidates, {seq.seq_id: seq.draft_len for seq in seqs})

    def _propose(self, seqs: list[Sequence]) -> dict[int, DraftProposal]:
        drafts, requests = {}, []
        plan = self._plan(seqs) if self.drafter is not None else Plan({})
        self._expected = plan
        threshold, stretch = self.policy.early_stop(plan, self.drafter is not None and self.drafter.stops_early)
        for seq in seqs:
            k = plan.ks.get(seq.seq_id, 0)
            ahead = self._predrafted(seq)
            if ahead is not None:  # drafted while the target verified the last step: free now
                drafts[seq.seq_id] = ahead
                plan.ks[seq.seq_id] = len(ahead.draft_ids)
                seq.stats.steps_predrafted += 1
                continue
            if k == 0:
                drafts[seq.seq_id] = DraftProposal(draft_ids=[])
                continue
            p = seq.params
            far = stretch is not None and p.greedy  # a confident run may draft on past k, to the cap
            requests.append(DraftRequest(seq.seq_id, self._draft_cap(seq) if far else k, p.temperature, p.top_k,
                                         p.top_p, seq.generator, threshold if p.greedy else 0.0, k, stretch or 1.0))
        if not requests:
            return drafts
        step_s = self._forward_s(seqs, plan.ks)  # for drafters weighing their cost against the target's
        requests = [replace(r, step_s=step_s) for r in requests]
        opening, t0 = sum(self._opening(self.sequences[r.seq_id]) for r in requests), time.perf_counter()
        self.drafter.prepare([r.seq_id for r in requests])  # e.g. KV handoff: transfer spans of its own
        self.policy.cost.record_opening(opening, time.perf_counter() - t0)
        t0 = time.perf_counter()
        flow = self.tracer.new_flow()
        self._flows.update((r.seq_id, flow) for r in requests)
        # one span per step (a batched drafter answers for every sequence at once)
        request = requests[0].seq_id if len(requests) == 1 else None
        with self.tracer.span("draft", self._drafter_track, self.num_steps, request, flow_out=flow):
            drafts.update(self.drafter.propose_batch(requests))
        elapsed = time.perf_counter() - t0
        if self.overlap is not None:
            self.overlap.gate.fresh_s.add(elapsed / len(requests))
        catch_up = sum(self._drafter_lag(self.sequences[r.seq_id]) - 1 for r in requests)
        lengths = [len(drafts[r.seq_id].draft_ids) for r in requests]
        self.policy.cost.record_draft(len(requests), sum(lengths), catch_up, elapsed, max(lengths),
                                      self.drafter.last_catch_up)
        for r in requests:
            seq = self.sequences[r.seq_id]
            seq.stats.time_draft_s += elapsed
            if drafts[r.seq_id].unavailable:
                seq.stats.num_fallback_steps += 1
        return drafts

    def _predrafted(self, seq: Sequence) -> DraftProposal | None:
        return None if self.overlap is None else self.overlap.predrafted(seq, self._draft_cap(seq))

    def _draft_ahead(self, seqs: list[Sequence], drafts: dict[int, DraftProposal]) -> None:
        lengths = {seq.seq_id: len(drafts[seq.seq_id].draft_ids) for seq in seqs}
        self.overlap.draft_ahead(seqs, drafts, {seq.seq_id: self._draft_cap(seq) for seq in seqs},
                                 self._expected.ks, self.policy.confidence_threshold(self._expected),
                                 self._forward_s(seqs, lengths), self.num_steps)

    def _forward_s(self, seqs: list[Sequence], num_drafts: dict[int, int]) -> float:
        """The verify curve's seconds for a forward over `seqs`' pending tokens and drafts (0: no
        forward measured yet)."""
        verify = self.policy.cost.verify
        if not verify.measured:
            return 0.0
        return verify(sum(seq.num_tokens - self.target.kv_length(seq.seq_id) + num_drafts.get(seq.seq_id, 0)
                          for seq in seqs))

    def _drafter_lag(self, seq: Sequence) -> int:
        """Committed tokens the drafter would run before drafting: before its first draft all of them,
        unless that draft opens it with the target's K/V (then the newest only, as after any draft)."""
        if seq.acceptance.drafted:
            return seq.drafter_lag
        return 1 if self.drafter.opens_caught_up else seq.num_tokens

    def _opening(self, seq: Sequence) -> int:  # tokens a first draft takes over from the target's K/V
        return 0 if seq.acceptance.drafted or not self.drafter.opens_caught_up else seq.num_tokens - 1

    def _draft_cap(self, seq: Sequence) -> int:
        """The most `seq` may draft now: its request's k, the tokens it still needs, the room left."""
        if not seq.prefilled or seq.k == 0:
            return 0
        room = self.max_len - seq.num_tokens - 1
        return max(0, min(seq.k, seq.remaining - 1, room))

    def _verify(self, seqs: list[Sequence], drafts: dict[int, DraftProposal]) -> list[VerifyResult]:
        batch, starts = [], []
        for seq in seqs:
            # committed tokens without K/V: the whole prompt at first (or after a preemption),
            # afterwards just the newest token; then the drafts
            starts.append(self.target.kv_length(seq.seq_id))
            pending = seq.ids_from(starts[-1])
            d = drafts[seq.seq_id].draft_ids
            batch.append((seq.seq_id, pending + d, len(d) + 1))
        t0 = time.perf_counter()
        # draft ids reach the target in process (a list, no copy); the flow marks the hand-off
        flows, self._flows = tuple(dict.fromkeys(self._flows.values())), {}
        phase = "verify" if any(seq.prefilled for seq in seqs) else "prefill"
        num_tokens = sum(len(b[1]) for b in batch)
        expected = {}
        if self._expected.expected_s:  # the cost model's prediction, made before the step
            expected = dict(expected_tokens=self._expected.expected_tokens, expected_ms=self._expected.expected_s * 1e3)
        with self.tracer.span(phase, self._target_track, self.num_steps, flow_in=flows, num_tokens=num_tokens,
                              **expected):
            outputs = self.target.forward(batch, return_hidden=self.hidden_feed is not None)
        if self.hidden_feed is not None:
            self.hidden_feed.capture([seq.seq_id for seq in seqs], starts, outputs)
        # on a device target, verification reads its scores on the host (argmax ids; distributions if sampled)
        on_host = self.target.device.type == "cpu"
        with nullcontext() if on_host else self.tracer.span("d2h", self._target_track, self.num_steps):
            results = [self._accept(seq, drafts[seq.seq_id], out.logits) for seq, out in zip(seqs, outputs)]
        elapsed = time.perf_counter() - t0
        if self.overlap is not None and phase == "verify":
            self.overlap.gate.record_forward(num_tokens, elapsed, self.overlap.running)
        self.preempter.policy.record_forward(num_tokens, elapsed)
        for seq in seqs:
            if seq.prefilled:
                seq.stats.time_verify_s += elapsed
            else:
                seq.stats.time_prefill_s += elapsed
        if self.overlap is None or not self.overlap.running or self.overlap.gate.favoured:  # not a probe's slow forward
            self.policy.cost.record_forward(num_tokens, elapsed)  # (it tilted the plan made without the worker)
        return results

    def _accept(self, seq: Sequence, draft: DraftProposal, logits: torch.Tensor) -> VerifyResult:
        # logits: [num_draft + 1, vocab]
        n = len(draft.draft_ids)
        draft_ids = torch.tensor([draft.draft_ids], dtype=torch.long).view(1, n)
        p, policy, stats, allowance = seq.params, seq.policy, seq.stats, 0
        if policy.lossy:  # the quality budget: tokens the target would not have chosen, per request
            allowance = int(policy.budget * p.max_new_tokens) - stats.tokens_differing
            if allowance <= 0 and stats.budget_exhausted_at < 0:
                stats.budget_exhausted_at = len(seq.output_ids)
        q = None if draft.draft_probs is None else draft.draft_probs[None]  # [1, n, drafter vocab]
        with self.tracer.span("accept", self._target_track, self.num_steps, seq.seq_id):
            result, differing, gap = verify_request(policy, draft_ids, logits[None], p.temperature, p.top_k,
                                                    p.top_p, q, seq.generator, len(seq.output_ids), allowance)
        stats.tokens_differing += differing
        stats.prob_gap += gap
        return result

    # ---- commit and emit -------------------------------------------------------------

    def _commit(self, seq: Sequence, draft: DraftProposal, res: VerifyResult) -> StepOutput:
        tracer, step = self.tracer, self.num_steps
        with tracer.span("commit", self._host, step, seq.seq_id) as span:
            num_accepted = int(res.num_accepted[0])
            new_ids = res.output_ids[0, :num_accepted + 1].tolist()
            if span is not None and seq.prefilled:  # a verify step (not the prefill): its counts
                span.args.update(num_draft=len(draft.draft_ids), num_accepted=num_accepted)
            self._record(seq, draft, num_accepted, len(new_ids))
        first = not seq.prefilled
        # K/V is kept for every committed token but the newest, which is fed next step.
        with tracer.span("rollback", self._target_track, step, seq.seq_id):
            self.target.rollback(seq.seq_id, seq.num_tokens + num_accepted)
        if first and self.drafter is not None and seq.k:
            # outside any span: a drafter that moves the prompt's K/V records its own transfer spans
            self.drafter.start(seq.seq_id, seq.prompt_ids)
        with tracer.span("emit", self._host, step, seq.seq_id):
            return self._emit(seq, new_ids)

    def _record(self, seq: Sequence, draft: DraftProposal, num_accepted: int, num_committed: int) -> None:
        if not seq.prefilled:
            seq.first_token_s = time.perf_counter()
            return
        num_draft = len(draft.draft_ids)
        stats = seq.stats
        stats.record(num_draft, num_accepted, num_committed)
        k = self._expected.ks.get(seq.seq_id, 0)
        stats.steps_per_k[k] = stats.steps_per_k.get(k, 0) + 1
        stats.steps_stretched += 0 < k < num_draft
        # for the cost model a planned draft the drafter declined (early stop, no n-gram match) counts as
        # judged and rejected: its rates are P(drafted and accepted), what a plan of k drafts commits
        # (drafts past the plan, a confident run, were chosen for it: they do not count in the plan's rates)
        planned = num_draft if draft.unavailable else k if 0 < k < num_draft else max(num_draft, k)
        stats.expected_committed += self.policy.cost.expected_tokens(seq.acceptance, planned)
        self.policy.cost.record_verify(seq.acceptance, planned, min(num_accepted, planned))
        if draft.confidence and seq.params.greedy:
            self.policy.cost.confidence.record(draft.confidence, num_accepted)
        # the drafter cached its accepted drafts: only the recovered/bonus token is new to it
        seq.drafter_lag = 1 if num_draft else seq.drafter_lag + num_committed
        if num_draft:
            seq.draft_len = next_draft_len(seq.draft_len, num_draft, num_accepted, seq.k)

    def _emit(self, seq: Sequence, new_ids: list[int]) -> StepOutput:
        """Apply EOS/length/stop limits, stream the new text, finish or hand ids to the drafter."""
        new_ids, reason = self._apply_limits(seq, new_ids)
        seq.output_ids.extend(new_ids)
        if reason is None and seq.num_tokens >= self.max_len:
            reason = "length"
        stream = self._streams[seq.seq_id]
        text, stopped = stream.update(seq.output_ids, final=reason is not None)
        seq.text = stream.emitted
        if stopped:
            reason = "stop"
        if reason is not None:
            self._finish(seq, reason)
        elif self.drafter is not None and seq.k:
            self.drafter.extend(seq.seq_id, new_ids)
            if self.hidden_feed is not None:  # the states of the positions this step committed
                self.hidden_feed.deliver(seq.seq_id, self.target.kv_length(seq.seq_id), self.num_steps)
        return StepOutput(seq.seq_id, new_ids, text, reason is not None, reason)

    def _apply_limits(self, seq: Sequence, new_ids: list[int]) -> tuple[list[int], str | None]:
        for i, t in enumerate(new_ids):
            if t in self.eos_token_ids and not seq.params.ignore_eos:
                return new_ids[:i + 1], "eos"
        if len(new_ids) >= seq.remaining:
            return new_ids[:seq.remaining], "length"
        return new_ids, None

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.finish_s = time.perf_counter()
        self.scheduler.remove(seq)
        self.target.free(seq.seq_id)
        self.preempter.release(seq.seq_id)  # finished or cancelled while swapped out
        if self.drafter is not None and seq.k:
            self.drafter.finish(seq.seq_id)
        for part in (self.overlap, self.hidden_feed):
            if part is not None:
                part.forget(seq.seq_id)

    @property
    def num_preemptions_swap(self) -> int:
        return self.preempter.num_swap

    @property
    def num_preemptions_recompute(self) -> int:
        return self.preempter.num_recompute

    def generate(self, prompt_ids: list[int], params: SamplingParams,
                 on_output: Callable[[StepOutput], None] | None = None) -> Sequence:
        """Run one request to completion (other requests in flight advance too)."""
        seq_id = self.add_request(prompt_ids, params)
        seq = self.sequences[seq_id]
        while seq.status is not Status.FINISHED:
            for out in self.step():
                if out.seq_id == seq_id and on_output is not None:
                    on_output(out)
        return self.release(seq_id)

    def release(self, seq_id: int) -> Sequence:
        """Forget a finished request and hand back its final state."""
        self._streams.pop(seq_id, None)
        return self.sequences.pop(seq_id)
