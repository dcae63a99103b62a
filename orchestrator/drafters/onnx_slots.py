"""Host K/V for a shared-buffer (GQA) ONNX drafter, every sequence in one set of buffers, so that one
ONNX Runtime run drafts for several sequences.

Each layer's key and value live in one array [slots, kv_heads, capacity, head_dim], a sequence per
slot; a run binds the rows of a slot range as both past input and present output. Rows carry their
own lengths through the attention mask (ones up to the row's past + new tokens: GQA's per-row
sequence length) and their own position ids. A row in the range that is not drafting this time runs
a dummy token at its first free position, which nothing reads: positions at or past a row's length
are never attended to and are overwritten by its next real token.
"""

import numpy as np
import onnxruntime as ort

from orchestrator.errors import InvalidRequestError


class SlotPool:
    BLOCK = 256  # capacity grows in multiples of this many positions
    MIN_SLOTS = 4

    def __init__(self, drafter):
        self.drafter = drafter
        self.arrays: list[np.ndarray] = []  # per past input: [slots, kv_heads, capacity, head_dim]
        self.lengths: list[int] = []  # per slot: positions holding the sequence's K/V
        self.used: list[bool] = []
        self.capacity = 0
        # per slot range: an IO binding with the K/V views bound (rebuilt when the arrays are), and
        # the logits buffer of the last one-token run, so a drafting step binds only its token inputs
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self._logits: np.ndarray | None = None

    def acquire(self, num_tokens: int) -> "Slot":
        """The lowest free slot (runs stay over short slot ranges), with room for `num_tokens`."""
        slot = next((i for i, used in enumerate(self.used) if not used), len(self.used))
        self._ensure(slot + 1, num_tokens + 64)
        self.used[slot], self.lengths[slot] = True, 0
        return Slot(self, slot)

    def release(self, slot: int) -> None:
        self.used[slot], self.lengths[slot] = False, 0
        if not any(self.used):  # nothing open: give the memory back
            self.arrays, self.lengths, self.used, self.capacity = [], [], [], 0
            self._bindings, self._logits = {}, None

    def truncate(self, slot: int, length: int) -> None:
        self.lengths[slot] = min(self.lengths[slot], length)

    def write_prefix(self, slot: int, kv: np.ndarray) -> None:
        """kv: [num_layers, 2, kv_heads, T, head_dim] fills positions [0, T) of the slot."""
        T = kv.shape[3]
        self._ensure(len(self.used), T)
        for i, array in enumerate(self.arrays):  # past inputs: layer 0 key, layer 0 value, ...
            array[slot, :, :T] = kv[i // 2, i % 2]
        self.lengths[slot] = T

    def run(self, rows: list[tuple[int, list[int]]]) -> np.ndarray:
        """rows: (slot, new token ids): one row with any number of tokens, or several rows with one
        each. -> logits at each row's last token, [len(rows), vocab] float32, in the order given."""
        d = self.drafter
        num_new = max(len(ids) for _, ids in rows)
        if len(rows) > 1 and num_new != 1:
            raise ValueError("rows of a batched run carry one token each")
        lo, hi = min(s for s, _ in rows), max(s for s, _ in rows) + 1
        new = dict(rows)
        past = np.array(self.lengths[lo:hi])
        total = past + num_new  # dummy rows run num_new (= 1) token too
        self._ensure(hi, int(total.max()))
        ids = np.zeros((hi - lo, num_new), d._ids_dtype)
        for s, row in new.items():
            ids[s - lo] = row
        mask = (np.arange(int(total.max()))[None] < total[:, None]).astype(d._mask_dtype)  # [rows, T]
        binding = self._binding(lo, hi)
        binding.bind_cpu_input(d._input_ids, ids)
        binding.bind_cpu_input(d._attention_mask, mask)
        if d._position_ids:
            positions = past[:, None] + np.arange(num_new)[None]  # [rows, num_new]
            binding.bind_cpu_input(d._position_ids, positions.astype(d._position_dtype))
        if num_new == 1 and d.logits_width:  # a drafting step: ORT writes the logits into our buffer
            shape = (hi - lo, 1, d.logits_width)
            if self._logits is None or self._logits.shape != shape:
                self._logits = np.empty(shape, np.float32)
            binding.bind_output("logits", "cpu", 0, np.float32, list(shape), self._logits.ctypes.data)
            d.session.run_with_iobinding(binding)
            logits = self._logits
        else:
            binding.bind_output("logits", "cpu")
            d.session.run_with_iobinding(binding)
            logits = binding.get_outputs()[0].numpy()  # [rows, num_new, vocab]
        for s, row in new.items():
            self.lengths[s] += len(row)
        return np.stack([logits[s - lo, -1] for s, _ in rows]).astype(np.float32, copy=False)

    def _binding(self, lo: int, hi: int) -> ort.IOBinding:
        """An IO binding with slots [lo, hi) of every K/V array bound as past input and present output."""
        binding = self._bindings.get((lo, hi))
        if binding is None:
            d = self.drafter
            binding = d.session.io_binding()
            binding.bind_output("logits", "cpu")  # first: get_outputs()[0]; rebinding keeps its place
            for past_name, present_name, array in zip(d._past_inputs, d._outputs[1:], self.arrays):
                value = ort.OrtValue.ortvalue_from_numpy(array[lo:hi])  # a view: writes land in the pool
                binding.bind_ortvalue_input(past_name, value)
                binding.bind_ortvalue_output(present_name, value)
            self._bindings[(lo, hi)] = binding
        return binding

    def _ensure(self, num_slots: int, num_positions: int) -> None:
        d = self.drafter
        if num_positions > d.max_length:
            raise InvalidRequestError(
                f"{num_positions} tokens exceed the drafter's context length of {d.max_length}")
        slots = len(self.used)
        if num_slots <= slots and num_positions <= self.capacity:
            return
        new_slots = slots if num_slots <= slots else max(num_slots, 2 * slots, self.MIN_SLOTS)
        capacity = self.capacity
        if num_positions > capacity:
            capacity = min(max(2 * capacity, -(-num_positions // self.BLOCK) * self.BLOCK), d.max_length)
        shape = (new_slots, d.num_kv_heads, capacity, d.head_dim)
        arrays = []
        for i in range(len(d._past_inputs)):
            array = np.zeros(shape, d._kv_dtype)
            if self.arrays:
                array[:slots, :, :self.capacity] = self.arrays[i]
            arrays.append(array)
        self.arrays, self.capacity, self._bindings = arrays, capacity, {}
        self.lengths += [0] * (new_slots - slots)
        self.used += [False] * (new_slots - slots)


class Slot:
    """One sequence's row of the pool: the per-sequence cache handle `OnnxDrafter` keeps."""

    def __init__(self, pool: SlotPool, index: int):
        self.pool, self.index = pool, index

    def truncate(self, length: int) -> None:
        self.pool.truncate(self.index, length)

    def write_prefix(self, kv: np.ndarray) -> None:
        self.pool.write_prefix(self.index, kv)

    def release(self) -> None:
        self.pool.release(self.index)

    def host_kv(self) -> list[np.ndarray]:
        return [array[self.index] for array in self.pool.arrays]  # [kv_heads, capacity, head_dim] each
