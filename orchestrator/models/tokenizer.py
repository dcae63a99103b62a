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
        return encode_messages(tokenizer, [{"role": "user", "content": prompt}])
    return tokenizer(prompt).input_ids


def encode_messages(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation through the model's chat template, ready for the assistant's turn."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


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


def check_same_vocabulary(target_tokenizer, drafter_tokenizer, drafter_name: str) -> None:
    """A drafter from another checkpoint must speak the target's token ids.

    Every token both vocabularies hold must have the same id; tokens only one of them holds must
    come after all of the other's (padding or added tokens at the end). Anything else is refused.
    """
    target, drafter = target_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
    for token in target.keys() & drafter.keys():
        if target[token] != drafter[token]:
            raise CheckpointError(f"drafter {drafter_name}: its tokenizer gives {token!r} id {drafter[token]}, "
                                  f"the target's gives {target[token]}: a drafter must share the target's "
                                  f"vocabulary")
    for ours, theirs, who in ((target, drafter, "target"), (drafter, target, "drafter")):
        extra = [i for token, i in ours.items() if token not in theirs and i < len(theirs)]
        if extra:
            raise CheckpointError(f"drafter {drafter_name}: the {who}'s vocabulary has {len(extra)} token(s) the "
                                  f"other lacks inside its id range (e.g. id {min(extra)}): not the same vocabulary")
