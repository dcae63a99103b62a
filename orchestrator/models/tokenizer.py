"""A checkpoint's tokenizer, the one chat-template encoder, and the EOS ids generation stops at."""

import json

from orchestrator.errors import CheckpointError
from orchestrator.models.checkpoints import Checkpoint


def load_tokenizer(ckpt: Checkpoint):
    from transformers import AutoTokenizer  # heavy: only where a tokenizer is needed

    try:
        return AutoTokenizer.from_pretrained(ckpt.hf_dir)
    except Exception as e:  # transformers raises many kinds for a broken directory
        raise CheckpointError(f"could not load the tokenizer from {ckpt.hf_dir}: {e}") from e


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of a prompt, wrapped in the model's chat template when `chat` and it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return tokenizer(prompt).input_ids


def eos_token_ids(ckpt: Checkpoint, tokenizer) -> tuple[int, ...]:
    """EOS ids from generation_config.json, config.json and the tokenizer, merged."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = ckpt.hf_dir / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))
