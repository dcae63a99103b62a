"""Multi-token-prediction drafters trained for their target (seed 003): an EAGLE-like feature-level
layer that reads the target's last hidden states.

    model = MtpModel.load(dir)                       # config + safetensors, made by `hetspec train-drafter`
    train_drafter(TrainOptions(target="smollm2-135m", out=dir, tokens=200_000))

Rooms: `model` (the network, its checkpoint), `data` (prompts, self-distillation, the stdlib corpus,
the cached teacher pass), `train` (distillation loop, curves, resume).
"""

from orchestrator.mtp.model import MtpConfig, MtpModel

__all__ = ["MtpConfig", "MtpModel"]
