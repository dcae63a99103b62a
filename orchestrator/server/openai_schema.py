"""The OpenAI API's request bodies as hetspec accepts them, validated at the edge.

Strict types (a string is not a number), ranges as OpenAI documents them, and unknown fields
refused by name, so a typo never silently changes a generation. Parameters OpenAI has and hetspec
does not implement are accepted only at their no-op values (`n: 1`, penalties 0, no logprobs).
Extensions, as vLLM spells them: `top_k`, `ignore_eos`; hetspec's own: `speculate`,
`num_speculative_tokens`, `acceptance` and `acceptance_options` (lossy policies: greedy requests only).
"""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from orchestrator.config import SamplingParams
from orchestrator.errors import InvalidRequestError

MAX_MESSAGES = 256
NoOpZero = Annotated[float, Field(ge=0.0, le=0.0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: StrictBool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: StrictStr
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[StrictInt, Field(ge=-1)] = -1  # vLLM: -1 (or 0) = off
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1)] = 1
    presence_penalty: NoOpZero = 0.0
    frequency_penalty: NoOpZero = 0.0
    user: StrictStr | None = None
    ignore_eos: StrictBool = False
    speculate: StrictBool = True
    num_speculative_tokens: StrictInt | None = None
    acceptance: StrictStr | None = None
    acceptance_options: dict[StrictStr, StrictFloat | StrictInt] | None = None

    def sampling_params(self, max_tokens: int | None, default_max_tokens: int, limit: int,
                        max_tokens_name: str = "max_tokens") -> SamplingParams:
        """`SamplingParams` with OpenAI's names in every error (`max_tokens`, not `max_new_tokens`)."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        params = SamplingParams(
            max_new_tokens=default_max_tokens if max_tokens is None else max_tokens,
            temperature=self.temperature, top_k=max(0, self.top_k), top_p=self.top_p, seed=self.seed,
            stop=stop, ignore_eos=self.ignore_eos, speculate=self.speculate,
            num_speculative_tokens=self.num_speculative_tokens, acceptance=self.acceptance,
            acceptance_options=tuple(sorted((self.acceptance_options or {}).items())))
        try:
            params.validate(limit)
        except InvalidRequestError as e:
            field = e.field.replace("max_new_tokens", max_tokens_name) if e.field else None
            raise InvalidRequestError(str(e).replace("max_new_tokens", max_tokens_name), field) from None
        return params


class CompletionRequest(_Sampling):
    """`POST /v1/completions`: one prompt, as text or token ids."""

    prompt: StrictStr | list[StrictStr] | list[StrictInt]
    max_tokens: StrictInt | None = None  # OpenAI's default is 16
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None

    def prompt_input(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, str):
            return p
        if all(isinstance(x, str) for x in p):
            if len(p) != 1:
                raise InvalidRequestError(f"prompt: one prompt per request (got a batch of {len(p)})", "prompt")
            return p[0]
        return list(p)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    def as_template_message(self) -> dict:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(_Sampling):
    """`POST /v1/chat/completions`: messages through the model's chat template."""

    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: Literal[False] | None = None

    def limit(self) -> tuple[int | None, str]:
        """The token limit the request set, and the name it used for it."""
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise InvalidRequestError("max_completion_tokens: send it or max_tokens, not both", "max_completion_tokens")
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"
